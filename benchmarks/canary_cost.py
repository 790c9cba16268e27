"""What canaries cost the traffic they watch: one prefill and two decode workers serve the same
chat load twice through a router without canaries; during the second run a second router over the
same workers sends canaries through every pair every second (60 times the default rate). Printed:
each run's throughput and time between tokens, and their ratio.

    PYTHONPATH=. .venv/bin/python benchmarks/canary_cost.py [--streams 8 --tokens 96 --rounds 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdserve.cli.supervisor import Supervisor  # noqa: E402
from pdserve.client import Client, ClientOptions  # noqa: E402
from pdserve.procs.health import wait_serving  # noqa: E402
from tests.helpers.cluster import cluster_flags  # noqa: E402

ENGINE = ["--threads", "1", "--kv-blocks", "256", "--host-kv-blocks", "64"]


def _stream(client: Client, i: int, tokens: int) -> list[float]:
    times = []
    for chunk in client.stream(f"Describe the town of Weir {i} and its river in detail.", max_tokens=tokens,
                               temperature=0, ignore_eos=True):
        times.extend([time.monotonic()] * len(chunk.token_ids))
    return times


def _load(target: str, streams: int, tokens: int) -> tuple[float, float, float]:
    """(tokens per second, median and p99 gap between tokens in ms) of `streams` streams at once."""
    with Client(target, ClientOptions(timeout_s=600)) as client:
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(streams) as pool:
            runs = list(pool.map(lambda i: _stream(client, i, tokens), range(streams)))
        elapsed = time.monotonic() - started
    gaps = sorted(b - a for times in runs for a, b in zip(times, times[1:]))
    return sum(map(len, runs)) / elapsed, statistics.median(gaps) * 1000, gaps[int(0.99 * (len(gaps) - 1))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs without and with canaries")
    args = ap.parse_args()
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n"})
    secured = cluster_flags(sup.workdir)
    try:
        children = {n: sup.spawn(n, [n.split("-")[0], "--port", "0", *ENGINE, *secured])
                    for n in ("prefill-0", "decode-0", "decode-1")}
        address = {n: f"127.0.0.1:{sup.wait_ready(c, 240)}" for n, c in children.items()}
        workers = ["--prefill-workers", address["prefill-0"], "--decode-workers",
                   f"{address['decode-0']},{address['decode-1']}"]
        router = sup.spawn("router", ["router", "--port", "0", *workers, "--canary-interval-s", "0", *secured])
        target = f"127.0.0.1:{sup.wait_ready(router, 240)}"
        wait_serving(target, 60)
        _load(target, args.streams, 16)  # warm-up
        results: dict[str, list[tuple[float, float, float]]] = {"without": [], "with": []}
        for r in range(args.rounds):
            results["without"].append(_load(target, args.streams, args.tokens))
            watcher = sup.spawn(f"canaries-{r}", ["router", "--port", "0", *workers, "--canary-interval-s", "1",
                                                  *secured])
            wait_serving(f"127.0.0.1:{sup.wait_ready(watcher, 240)}", 60)
            results["with"].append(_load(target, args.streams, args.tokens))
            sup.kill(watcher)
            sup.wait_exit(watcher, 30)
    finally:
        sup.stop()
    median = {k: tuple(statistics.median(x[i] for x in v) for i in range(3)) for k, v in results.items()}
    for name, (tps, p50, p99) in median.items():
        print(f"{name:>7} canaries every second: {tps:6.1f} tokens/s, gap p50 {p50:5.1f} ms, p99 {p99:6.1f} ms "
              f"(median of {args.rounds} runs)")
    print(f"throughput with / without: {median['with'][0] / median['without'][0]:.3f}; "
          f"gap p99 with / without: {median['with'][2] / median['without'][2]:.2f}")


if __name__ == "__main__":
    main()
