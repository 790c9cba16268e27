"""n samples of one prompt as one request (the prompt's KV moved once, its blocks shared on one
decode worker: router/flow/samples.py) against the same n sent as n requests at once, on a fleet of one
prefill and one decode worker on the embedded model: the KV bytes moved from prefill to decode,
the decode worker's most blocks in use (polled every 20 ms), and the time until every sample ended.
Each case runs on a prompt of its own (random tokens, cached nowhere before), `--repeats` times.

    PYTHONPATH=. .venv/bin/python benchmarks/samples_fork.py [--prompt 2000] [--n 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdserve.cli.supervisor import Supervisor  # noqa: E402
from pdserve.client import Client, ClientOptions  # noqa: E402
from pdserve.procs.health import wait_serving  # noqa: E402
from tests.helpers.cluster import cluster_flags  # noqa: E402
from tests.helpers.worker_stats import worker_stats  # noqa: E402

ENGINE = ["--threads", "1", "--kv-blocks", "1024", "--host-kv-blocks", "0", "--token-budget", "512",
          "--max-chunk-tokens", "512"]
TOKENS = 16


class PeakBlocks:
    """The decode worker's most blocks in use while a case runs."""

    def __init__(self, address: str):
        self.address, self.peak, self._stop = address, 0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> PeakBlocks:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, worker_stats(self.address, "decode").blocks_active)
            time.sleep(0.02)


def _as_one(client: Client, prompt: list[int], n: int) -> int:
    samples = client.stream(token_ids=prompt, n=n, max_tokens=TOKENS, temperature=0.9,
                            ignore_eos=True).collect_samples()
    return sum(s.usage.kv_transfer_bytes for s in samples)


def _as_many(client: Client, prompt: list[int], n: int) -> int:
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        done = list(pool.map(lambda _: client.generate(token_ids=prompt, max_tokens=TOKENS, temperature=0.9,
                                                       ignore_eos=True), range(n)))
    return sum(c.usage.kv_transfer_bytes for c in done)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=2000)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rng = random.Random(5)
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n"})
    secured = cluster_flags(sup.workdir)
    try:
        children = {role: sup.spawn(role, [role, "--port", "0", *ENGINE, *secured]) for role in ("prefill", "decode")}
        address = {role: f"127.0.0.1:{sup.wait_ready(c, 240)}" for role, c in children.items()}
        router = sup.spawn("router", ["router", "--port", "0", "--prefill-workers", address["prefill"],
                                      "--decode-workers", address["decode"], "--canary-interval-s", "0", *secured])
        target = f"127.0.0.1:{sup.wait_ready(router, 240)}"
        wait_serving(target, 60)
        results: dict[str, list[tuple[int, int, float]]] = {"one request, n samples": [], "n requests": []}
        with Client(target, ClientOptions(timeout_s=600)) as client:
            client.generate("warm up", max_tokens=4)
            for _ in range(args.repeats):
                for name, run in (("one request, n samples", _as_one), ("n requests", _as_many)):
                    prompt = [1] + [rng.randrange(100, 40000) for _ in range(args.prompt - 1)]
                    with PeakBlocks(address["decode"]) as peak:
                        started = time.perf_counter()
                        moved = run(client, prompt, args.n)
                        seconds = time.perf_counter() - started
                    results[name].append((moved, peak.peak, seconds))
        print(f"{args.prompt}-token prompt, n = {args.n}, {TOKENS} tokens each, 1P1D, embedded model, "
              f"{args.repeats} runs (median)")
        print(f"{'case':<24} {'KV moved MB':>12} {'peak blocks':>12} {'all ended s':>12}")
        for name, rows in results.items():
            moved, peak, seconds = (statistics.median(col) for col in zip(*rows))
            print(f"{name:<24} {moved / 1e6:>12.1f} {peak:>12.0f} {seconds:>12.2f}")
    finally:
        sup.stop()


if __name__ == "__main__":
    main()
