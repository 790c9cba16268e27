"""Runs every benchmark in this folder once with small, quick settings and prints their figures.

About 5 minutes on 2 cores (model_throughput, tracing_overhead and AIPerf take most of it). The figures
are smoke-sized: docs/BENCHMARKS.md gives the command lines of the published ones.
    .venv/bin/python benchmarks/run_all.py [--only NAME ...] [--list]
Exits non-zero when a benchmark fails or runs over --timeout-s.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Benchmark:
    name: str  # the script, benchmarks/<name>.py
    args: tuple[str, ...]


BENCHMARKS = (
    Benchmark("scheduler_overhead", ("--steps", "500", "--warmup", "100")),
    Benchmark("prefix_cache", ()),
    Benchmark("kv_transfer", ("--mib", "32", "--repeats", "2")),
    Benchmark("model_throughput", ("--threads", "2", "--prompt-tokens", "128", "--batches", "1,4",
                                   "--context", "64", "--steps", "8", "--repeats", "1")),
    Benchmark("tracing_overhead", ("--rounds", "2", "--requests", "2", "--tokens", "16")),
    Benchmark("http_vs_grpc", ("--rounds", "2", "--concurrency", "4", "--tokens", "16")),
    Benchmark("worker_start", ("--repeats", "1", "--spawns", "1")),
    Benchmark("step_time", ("--trials", "1", "--target-ms", "100")),
    Benchmark("router_start", ("--spawns", "1")),
    Benchmark("rank_checkpoint_read", ()),
    # NVIDIA's AIPerf (a third-party client, its own venv made on first use) against `pdserve up`,
    # its per-request figures beside the router's spans; `make bench-aiperf` runs the full set
    Benchmark("aiperf", ("--runs", "chat,goodput", "--requests", "8", "--concurrency", "4",
                         "--output-tokens", "16")),
    Benchmark("windowed_kv", ("--prompt-tokens", "2048", "--new-tokens", "8")),
    Benchmark("reattach", ("--streams", "12", "--tokens", "600")),
)


class Outcome(Enum):
    OK = "ok"
    FAILED = "failed"
    TIMED_OUT = "timed out"


@dataclass(frozen=True)
class Result:
    benchmark: Benchmark
    outcome: Outcome
    seconds: float


def command(benchmark: Benchmark) -> list[str]:
    return [sys.executable, str(HERE / f"{benchmark.name}.py"), *benchmark.args]


def run(benchmark: Benchmark, timeout_s: float) -> Result:
    """Runs one benchmark in its own process group, its output going straight to ours."""
    print(f"\n=== {benchmark.name}: {' '.join(['benchmarks/' + benchmark.name + '.py', *benchmark.args])}",
          flush=True)
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "UCX_WARN_UNUSED_ENV_VARS": "n"}
    started = time.monotonic()
    process = subprocess.Popen(command(benchmark), env=env, start_new_session=True)
    try:
        outcome = Outcome.OK if process.wait(timeout=timeout_s) == 0 else Outcome.FAILED
    except subprocess.TimeoutExpired:
        outcome = Outcome.TIMED_OUT
    finally:
        _end_group(process)
    return Result(benchmark, outcome, time.monotonic() - started)


def _end_group(process: subprocess.Popen) -> None:
    """Ends whatever the benchmark left running (servers it spawned), then reaps it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def unlisted() -> list[str]:
    """Benchmark scripts in this folder that BENCHMARKS does not run."""
    listed = {b.name for b in BENCHMARKS} | {Path(__file__).stem}
    return sorted(p.stem for p in HERE.glob("*.py") if p.stem not in listed)


def summary(results: list[Result]) -> str:
    rows = [f"  {r.benchmark.name:<20} {r.outcome.value:<10} {r.seconds:7.1f} s" for r in results]
    return "\n".join(["", "=== summary", *rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=[b.name for b in BENCHMARKS], help="run just these")
    parser.add_argument("--list", action="store_true", help="print the command lines and exit")
    parser.add_argument("--timeout-s", type=float, default=600, help="per benchmark")
    args = parser.parse_args()
    chosen = [b for b in BENCHMARKS if args.only is None or b.name in args.only]
    if args.list:
        print("\n".join(" ".join(command(b)) for b in chosen))
        return 0
    results = [run(b, args.timeout_s) for b in chosen]
    print(summary(results))
    if unlisted():
        print(f"not run (add them to BENCHMARKS in {Path(__file__).name}): {', '.join(unlisted())}")
    return 0 if all(r.outcome is Outcome.OK for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
