"""A process's start as a log of phases, each its seconds, so a slow start says where it went.

    phases = StartPhases.since_process_start()   # the first phase: the interpreter and imports
    phases.done("model")                         # the seconds since the previous phase ended
    phases.done("probes")
    log.info("%s", phases.summary())             # start 2.61 s: imports 1.32, model 0.41, probes 0.02, ...

Phases are sequential: each one is the time from the end of the one before. Work a start leaves
to a thread of its own (the C kernels built behind it, the KV pool faulted in) is in no phase.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

IMPORTS = "imports"


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float


@dataclass
class StartPhases:
    """The phases of one start, in order. `clock`: monotonic seconds."""

    clock: Callable[[], float] = time.monotonic
    phases: list[Phase] = field(default_factory=list)
    _mark: float | None = None

    def __post_init__(self) -> None:
        if self._mark is None:
            self._mark = self.clock()

    @classmethod
    def since_process_start(cls) -> StartPhases:
        """Phases whose first, IMPORTS, runs from the process's start (where the system says when
        that was) to now."""
        phases = cls()
        started = process_age_s()
        if started is not None:
            phases.phases.append(Phase(IMPORTS, started))
        return phases

    def done(self, name: str) -> float:
        """Ends the phase `name` now; its seconds."""
        now = self.clock()
        seconds = now - self._mark
        self._mark = now
        self.phases.append(Phase(name, seconds))
        return seconds

    @property
    def total_s(self) -> float:
        return sum(p.seconds for p in self.phases)

    def summary(self) -> str:
        parts = ", ".join(f"{p.name} {p.seconds:.2f}" for p in self.phases)
        return f"start {self.total_s:.2f} s: {parts}"


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc/self/stat against the boot clock)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return max(time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / ticks, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
