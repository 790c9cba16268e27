"""The fleet across test hosts (network namespaces on a bridge, pdserve/procs/hosts.py), against
the same processes on one host. Root only. Three measurements:

    transfer   KV transfer GB/s: benchmarks/kv_transfer.py run on one host with its receiving
               children on another (UCX, gRPC and a plain TCP socket on the same veth, memcpy
               beside), then with both on one host
    ttft       a 1P1D fleet of the embedded model, router, prefill and decode on one host, then each
               on a host of its own: time to first token of prompts of each --prompt-tokens size
               (max_tokens 1, a fresh prompt each time: nothing cached), median of --repeats
    failover   a 1P2D fleet on four hosts: one decode host starts dropping every packet while
               short requests arrive one after another: the time from the cut to the first
               request served after it, and how each request in flight ended

    .venv/bin/python benchmarks/hosts.py transfer --mib 256 --repeats 5 [--rate-mbit 10000]
    .venv/bin/python benchmarks/hosts.py ttft --prompt-tokens 2048 8192 --repeats 3
    .venv/bin/python benchmarks/hosts.py failover
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pdserve.cli.supervisor import Supervisor  # noqa: E402
from pdserve.client import Client, ClientOptions, PdserveError  # noqa: E402
from pdserve.procs.health import wait_serving  # noqa: E402
from pdserve.procs.hosts import HostNetwork, TestHost  # noqa: E402
from tests.helpers.cluster import cluster_flags  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = ["--threads", "1", "--kv-blocks", "1280", "--host-kv-blocks", "64", "--max-chunk-tokens", "512",
          "--token-budget", "512"]


def transfer(args: argparse.Namespace) -> None:
    with HostNetwork.make(2) as net:
        here, there = net.hosts
        if args.rate_mbit:
            net.shape(there, rate_mbit=args.rate_mbit)
        common = ["--mib", str(args.mib), "--repeats", str(args.repeats)]
        for title, extra in ((f"across hosts ({here.address} -> {there.address})",
                              ["--peer-host", there.name, "--peer-address", there.address]),
                             ("on one host (the same namespace)", ["--peer-address", here.address])):
            print(f"== {title}", flush=True)
            subprocess.run([*here.launcher(), sys.executable, os.path.join(ROOT, "benchmarks/kv_transfer.py"),
                            *common, *extra], check=True, env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n"})


@contextmanager
def fleet(roles: dict[str, TestHost], decode: int = 1):
    """A router, a prefill worker and `decode` decode workers of the embedded model, each on the
    host `roles` names for it ("router", "prefill", "decode-0", ...): the router's address."""
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    secured = cluster_flags(sup.workdir)
    try:
        names = ["prefill", *[f"decode-{i}" for i in range(decode)]]
        children = {n: sup.spawn(n, [n.split("-")[0], "--host", roles[n].address, "--port", "0", *WORKER, *secured],
                                 launcher=tuple(roles[n].launcher())) for n in names}
        at = {n: f"{roles[n].address}:{sup.wait_ready(c, 300)}" for n, c in children.items()}
        decodes = ",".join(at[n] for n in names[1:])
        router = sup.spawn("router", ["router", "--host", roles["router"].address, "--port", "0",
                                      "--prefill-workers", at["prefill"], "--decode-workers", decodes, *secured],
                           launcher=tuple(roles["router"].launcher()))
        target = f"{roles['router'].address}:{sup.wait_ready(router, 300)}"
        wait_serving(target, 60)
        yield target
    finally:
        sup.stop()


def _prompt(tokens: int, rng: random.Random) -> list[int]:
    return [rng.randrange(1000, 40000) for _ in range(tokens)]  # plain vocabulary ids, never special


def ttft(args: argparse.Namespace) -> None:
    rng = random.Random(0)
    with HostNetwork.make(3) as net:
        a, b, c = net.hosts
        layouts = {"one host": {"router": a, "prefill": a, "decode-0": a},
                   "three hosts": {"router": a, "prefill": b, "decode-0": c}}
        results: dict[tuple[str, int], list[float]] = {}
        for layout, roles in layouts.items():
            with fleet(roles) as target, Client(target, ClientOptions(timeout_s=600)) as client:
                client.generate(token_ids=_prompt(64, rng), max_tokens=2)  # warm-up
                for size in args.prompt_tokens:
                    for _ in range(args.repeats):
                        done = client.generate(token_ids=_prompt(size, rng), max_tokens=1)
                        results.setdefault((layout, size), []).append(done.timings.ttft_s)
                        print(f"{layout:11s} {size:6d} tokens: TTFT {done.timings.ttft_s:.3f} s, KV "
                              f"{done.usage.kv_transfer_bytes / 2**20:.1f} MiB", flush=True)
        for size in args.prompt_tokens:
            one, three = (statistics.median(results[(k, size)]) for k in layouts)
            print(f"{size} tokens: TTFT median one host {one:.3f} s, three hosts {three:.3f} s, "
                  f"ratio {three / one:.3f}")


def failover(args: argparse.Namespace) -> None:
    with HostNetwork.make(4) as net:
        roles = dict(zip(("router", "prefill", "decode-0", "decode-1"), net.hosts))
        with fleet(roles, decode=2) as target, Client(target, ClientOptions(timeout_s=60)) as client:
            rng = random.Random(1)
            for _ in range(4):
                client.generate(token_ids=_prompt(32, rng), max_tokens=4)
            net.blackhole(roles["decode-0"])
            cut = time.monotonic()
            outcomes = []
            while time.monotonic() - cut < args.seconds:
                started = time.monotonic()
                try:
                    client.generate(token_ids=_prompt(32, rng), max_tokens=4)
                    outcomes.append(("served", started - cut, time.monotonic() - cut))
                except PdserveError as exc:
                    outcomes.append((exc.code, started - cut, time.monotonic() - cut))
            net.clear(roles["decode-0"])
        for outcome, sent, ended in outcomes[:8]:
            print(f"sent at +{sent:.2f} s: {outcome} at +{ended:.2f} s")
        served = [ended for outcome, _, ended in outcomes if outcome == "served"]
        print(f"{len(outcomes)} requests in {args.seconds:.0f} s after the cut, {len(served)} served; "
              f"first served {served[0]:.2f} s after the cut" if served else "none served")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("transfer")
    t.add_argument("--mib", type=int, default=256)
    t.add_argument("--repeats", type=int, default=5)
    t.add_argument("--rate-mbit", type=float, default=0.0, help="cap the peer host's link (tbf)")
    f = sub.add_parser("ttft")
    f.add_argument("--prompt-tokens", type=int, nargs="+", default=[2048, 8192])
    f.add_argument("--repeats", type=int, default=3)
    o = sub.add_parser("failover")
    o.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    why = HostNetwork.unavailable()
    if why is not None:
        sys.exit(f"no test hosts here: {why}")
    {"transfer": transfer, "ttft": ttft, "failover": failover}[args.what](args)


if __name__ == "__main__":
    main()
