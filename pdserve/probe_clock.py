"""The clock the route probes time their alternatives with (the products' layouts, the decode
kernel against the sparse products, the fused decode step against the layers one by one).

    clock = probe_clock()          # time.thread_time on one thread, else time.perf_counter
    started = clock(); work(); took = clock() - started

On one thread the work runs on the calling thread alone, and its CPU time is what it costs: a
neighbour that takes the core away for a while lengthens the wall-clock time of whichever
alternative it met, not its CPU time, so on a shared machine the choice follows the alternatives,
not the neighbour (a probe timed by the wall clock in a loaded minute once chose the slower route
and kept it). On several threads the work is spread over threads this one cannot see, so the
wall clock is kept there. CLOCK_KEY names the clock in the measurements' keys, so that figures
timed by another clock are measured again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

Clock = Callable[[], float]


def probe_clock(threads: int | None = None) -> Clock:
    """The calling thread's CPU time when the work runs on `threads` == 1 (default: torch's
    threads now), else the wall clock."""
    threads = torch.get_num_threads() if threads is None else threads
    return time.thread_time if threads == 1 else time.perf_counter


def clock_name(threads: int | None = None) -> str:
    """"thread" or "wall": the clock probe_clock(threads) gives, for the measurements' keys."""
    return "thread" if probe_clock(threads) is time.thread_time else "wall"
