"""A running request's KV moved to another decode worker, against prefilling it again there: for
contexts of 256 to 4,096 tokens, the largest gap between tokens a client sees when its decode
worker leaves mid-stream.

Fleet: one prefill worker P and two elastic decode workers E1, E2 (`--elastic`), and two routers
over them: one with `--on-leave move` (the default), one with `--on-leave prefill`. For each
context length and each router: one greedy stream whose prompt is that many random tokens; once
it has 8 tokens out, the decode worker holding it is told to serve prefill (SetRole, as `pdserve
set-role` does), so the stream leaves; then the worker is set back to decode. The prefill router's
resume finds the prompt in P's prefix cache (it prefilled it), so it recomputes only the tokens
generated so far; a cold prefill of the whole context, timed in this process on the same model
and one thread, is printed beside them.

    PYTHONPATH=. .venv/bin/python benchmarks/kv_move.py [--lengths 256,512,1024,2048,4096]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdserve.cli.supervisor import Supervisor  # noqa: E402
from pdserve.client import Client, ClientOptions  # noqa: E402
from pdserve.procs.health import wait_serving  # noqa: E402
from pdserve.v1 import worker_pb2 as wpb  # noqa: E402
from pdserve.v1 import worker_pb2_grpc  # noqa: E402
from tests.helpers.cluster import cluster_flags, cluster_metadata  # noqa: E402
from tests.helpers.worker_stats import worker_stats  # noqa: E402

ENGINE = ["--threads", "1", "--kv-blocks", "1024", "--host-kv-blocks", "64", "--token-budget", "512",
          "--max-chunk-tokens", "512"]
TOKENS = 48
LEAVE_AFTER = 8


def _set_role(sup, address: str, role: str) -> None:
    with grpc.insecure_channel(address) as channel:
        worker_pb2_grpc.WorkerControlStub(channel).SetRole(wpb.SetRoleRequest(role=role),
                                                           metadata=cluster_metadata(sup.workdir), timeout=10)


def _wait_role(address: str, role: str, timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        stats = worker_stats(address, "decode")
        if stats.role == role and not stats.next_role:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{address} never served {role}")


def _one(sup, target: str, decode: dict[str, str], prompt: list[int]) -> tuple[float, float]:
    """The stream's largest gap after its decode worker was told to leave, and its median gap before."""
    with Client(target, ClientOptions(timeout_s=600)) as client:
        times = []
        left = None
        for chunk in client.stream(token_ids=prompt, max_tokens=TOKENS, temperature=0, ignore_eos=True):
            if not chunk.token_ids:
                continue
            times.extend([time.monotonic()] * len(chunk.token_ids))
            if left is None and len(times) >= LEAVE_AFTER:
                left = next(a for a in decode.values() if worker_stats(a, "decode").requests_running)
                told = time.monotonic()
                _set_role(sup, left, "prefill")
        assert left is not None and len(times) == TOKENS, (left, len(times))
    _wait_role(left, "prefill")
    _set_role(sup, left, "decode")
    _wait_role(left, "decode")
    before = [b - a for a, b in zip(times[1:LEAVE_AFTER], times[2:LEAVE_AFTER])]
    after = [b - a for a, b in zip(times, times[1:]) if b >= told]
    return max(after), statistics.median(before)


def _cold_prefill_s(lengths: list[int]) -> dict[int, float]:
    """Seconds to prefill each context from nothing, on the embedded model, one thread, this process."""
    import torch

    from pdserve.config import CacheConfig, EngineConfig
    from pdserve.engine.llm import LLM
    from pdserve.requests import SamplingParams

    torch.set_num_threads(1)
    llm = LLM(EngineConfig(cache=CacheConfig(num_blocks=1024, prefix_cache=False)))
    rng = random.Random(7)
    seconds = {}
    for n in lengths:
        prompt = [rng.randrange(100, 40000) for _ in range(n)]
        started = time.perf_counter()
        llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0))
        seconds[n] = time.perf_counter() - started
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="256,512,1024,2048,4096")
    args = ap.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n"})
    secured = cluster_flags(sup.workdir)
    try:
        children = {name: sup.spawn(name, [role, "--port", "0", *ENGINE, *secured, *extra])
                    for name, role, extra in (("P", "prefill", []), ("E1", "decode", ["--elastic"]),
                                              ("E2", "decode", ["--elastic"]))}
        address = {name: f"127.0.0.1:{sup.wait_ready(child, 240)}" for name, child in children.items()}
        decode = {n: address[n] for n in ("E1", "E2")}
        routers = {}
        for mode in ("move", "prefill"):
            router = sup.spawn(f"router-{mode}", ["router", "--port", "0", "--prefill-workers", address["P"],
                                                  "--decode-workers", ",".join(decode.values()),
                                                  "--on-leave", mode, *secured])
            routers[mode] = f"127.0.0.1:{sup.wait_ready(router, 240)}"
            wait_serving(routers[mode], 60)
        rng = random.Random(11)
        rows = []
        for n in lengths:
            row = {"tokens": n}
            for mode, target in routers.items():
                prompt = [rng.randrange(100, 40000) for _ in range(n)]
                row[mode], row[f"{mode}_tbt"] = _one(sup, target, decode, prompt)
            rows.append(row)
            print(f"{n:>6} tokens: largest gap, KV moved {row['move']:.3f} s; prefilled again {row['prefill']:.3f} s "
                  f"(median gap before {row['move_tbt'] * 1000:.0f} / {row['prefill_tbt'] * 1000:.0f} ms)",
                  flush=True)
    finally:
        sup.stop()
    cold = _cold_prefill_s(lengths)
    print("\n| context tokens | largest gap, KV moved | largest gap, prefilled again (prompt cached) "
          "| cold prefill of the context | moved / prefilled again |")
    print("|---:|---:|---:|---:|---:|")
    for row in rows:
        n = row["tokens"]
        print(f"| {n} | {row['move']:.3f} s | {row['prefill']:.3f} s | {cold[n]:.3f} s | "
              f"{row['move'] / row['prefill']:.2f} |")


if __name__ == "__main__":
    main()
