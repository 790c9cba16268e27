"""Clocks for timing the real engine. Two implementations side by side:

    WallClock   perf_counter and real sleeps: true latency on an otherwise idle machine
    CpuClock    the stepping thread's CPU time, idle waits skipped: steady on a shared machine
"""

from __future__ import annotations

import abc
import time
from typing import Any


class EngineClock(abc.ABC):
    """Where measured engine time comes from. Two implementations side by side."""

    @abc.abstractmethod
    def now(self) -> float:
        """Seconds since the clock was made."""

    @abc.abstractmethod
    def wait_until(self, when: float) -> None:
        """Let time pass until `when` (the engine has nothing to do)."""


class WallClock(EngineClock):
    """perf_counter and real sleeps: true latency, on a machine nobody else is using."""

    def __init__(self) -> None:
        self._start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._start

    def wait_until(self, when: float) -> None:
        time.sleep(max(0.0, when - self.now()))


class CpuClock(EngineClock):
    """CPU seconds of the stepping thread, idle waits skipped: the latency an idle machine would
    show, steady on a shared one. NOTE: counts one thread only, so use 1 torch thread with it."""

    def __init__(self) -> None:
        self._start = time.thread_time()
        self._idle = 0.0

    def now(self) -> float:
        return time.thread_time() - self._start + self._idle

    def wait_until(self, when: float) -> None:
        self._idle += max(0.0, when - self.now())


def timed_step(engine: Any, clock: EngineClock) -> tuple[Any, float]:
    start = clock.now()
    result = engine.step()
    return result, clock.now() - start
