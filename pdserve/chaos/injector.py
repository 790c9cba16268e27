"""Sends a fault schedule's signals to a fleet during a run, one thread per fault.

A fault waits for its time, then for the end of any earlier fault on the same worker (so two
never overlap, however long a restart takes) and, with a role budget, until fewer than that many
workers of its role are down. A fault whose time comes after the load finished is skipped; one
that fell due while the load ran is injected even when waiting behind an earlier fault took it past
the load's end (a restart slower than planned must not make a run skip faults it was due).
A stop ends at SIGCONT; a kill or a term ends when the worker serves again.
"""

from __future__ import annotations

import enum
import signal
import threading
import time
from dataclasses import dataclass

from pdserve.chaos.fleet import Fleet, role_of
from pdserve.chaos.schedule import Fault, FaultKind

SIGNALS = {FaultKind.KILL: signal.SIGKILL, FaultKind.TERM: signal.SIGTERM}


class Outcome(enum.Enum):
    PENDING = "pending"
    SKIPPED = "skipped"  # the load had finished before its time
    RECOVERED = "recovered"  # continued, or restarted and serving again
    NOT_RECOVERED = "not recovered"  # not serving again within the recovery timeout


@dataclass
class FaultRecord:
    """Times are Unix times; None while the fault has not started or ended. `due_at`: when its time
    came while the load ran (from then on it is injected, once its turn comes); None while not due,
    or when skipped."""

    fault: Fault
    outcome: Outcome = Outcome.PENDING
    started_at: float | None = None
    ended_at: float | None = None
    due_at: float | None = None


class Injector:
    def __init__(self, fleet: Fleet, faults: tuple[Fault, ...], recovery_timeout_s: float,
                 max_down_per_role: int = 0):
        """`max_down_per_role`: at most this many workers of one role faulted at once; 0: no limit."""
        self.fleet = fleet
        self.records = tuple(FaultRecord(f) for f in faults)
        self.recovery_timeout_s = recovery_timeout_s
        budget = max_down_per_role or max(1, len(faults))
        self._busy = {f.target: threading.Lock() for f in faults}
        self._down = {role_of(f.target): threading.Semaphore(budget) for f in faults}
        self._load_done = threading.Event()
        self._threads: list[threading.Thread] = []
        self.t0 = 0.0

    def start(self) -> None:
        """Fault times count from now: call right before the load starts."""
        self.t0 = time.time()
        for record in self.records:
            thread = threading.Thread(target=self._run, args=(record,), name=f"fault-{record.fault.target}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def load_finished(self) -> None:
        self._load_done.set()

    def restarting(self) -> set[str]:
        """Workers whose kill or term fault has begun and not ended: their process is gone or going."""
        return {r.fault.target for r in self.records
                if r.fault.kind in SIGNALS and r.started_at is not None and r.ended_at is None}

    def join(self) -> None:
        """Until every started fault has ended (a restart may outlive the load)."""
        for thread in self._threads:
            thread.join()

    def _run(self, record: FaultRecord) -> None:
        fault = record.fault
        if self._load_done.wait(max(0.0, self.t0 + fault.at_s - time.time())):
            record.outcome = Outcome.SKIPPED
            return
        record.due_at = time.time()
        with self._busy[fault.target], self._down[role_of(fault.target)]:
            record.started_at = time.time()
            record.outcome = self._inject(fault)
            record.ended_at = time.time()

    def _inject(self, fault: Fault) -> Outcome:
        if fault.kind is FaultKind.STOP:
            self.fleet.signal(fault.target, signal.SIGSTOP)
            time.sleep(fault.stop_s)
            self.fleet.signal(fault.target, signal.SIGCONT)
            return Outcome.RECOVERED
        before = self.fleet.generation(fault.target)
        self.fleet.signal(fault.target, SIGNALS[fault.kind])
        deadline = time.monotonic() + self.recovery_timeout_s
        while time.monotonic() < deadline:
            if self.fleet.restarted(fault.target, before):
                return Outcome.RECOVERED
            time.sleep(0.25)
        return Outcome.NOT_RECOVERED
