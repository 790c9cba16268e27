"""What the GPU checks share: a result row, a timer that waits for the device, progress lines."""

from __future__ import annotations

import enum
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


class Verdict(enum.Enum):
    OK = "ok"
    FAIL = "FAIL"
    ERROR = "ERROR"  # the check itself raised
    WARN = "warn"  # runs, but not as a GPU user should get it
    SKIP = "skip"  # cannot run here (one GPU, not built, not installed)
    INFO = "-"  # a measurement, no pass or fail


@dataclass(frozen=True)
class Row:
    check: str
    result: str
    verdict: Verdict = Verdict.INFO


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(run: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median wall time of `run` over `repeats` calls after `warmup` (device work included)."""
    for _ in range(warmup):
        run()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def progress(message: str) -> None:
    """A line on stderr while the checks run (the table goes to stdout at the end)."""
    print(f"gpu_check: {message}", file=sys.stderr, flush=True)


def release_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
