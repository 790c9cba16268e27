"""The injector against an in-memory fleet: signals in order, restarts awaited, faults serialised per
worker. Where a test needs one fault still going while another falls due, the first is a kill whose
worker comes back only when the test lets it (after waiting for that state), never after a pause."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from pdserve.chaos.fleet import Fleet, WorkerRef
from pdserve.chaos.injector import Injector, Outcome
from pdserve.chaos.schedule import Fault, FaultKind
from tests.helpers.waiting import wait_until


class FakeFleet(Fleet):
    """Records every signal. A killed or terminated worker is back `restart_s` later; with
    restart_s None, only once the test lets it back (`come_back`), and never otherwise."""

    def __init__(self, restart_s: float | None = 0.05):
        self.restart_s = restart_s
        self.sent: list[tuple[float, str, int]] = []
        self.generations = {"prefill-0": 1, "decode-0": 1, "decode-1": 1}
        self.back_at: dict[str, float] = {}
        self.down: set[str] = set()  # killed or terminated, waiting to be let back
        self.let_back: set[str] = set()
        self.lock = threading.Lock()

    def start(self) -> str:
        return "127.0.0.1:1"

    def workers(self) -> tuple[WorkerRef, ...]:
        return tuple(WorkerRef(n, n.split("-")[0], f"127.0.0.1:{i + 2}") for i, n in enumerate(self.generations))

    def signal(self, name: str, sig: int) -> None:
        with self.lock:
            self.sent.append((time.monotonic(), name, sig))
            if sig in (signal.SIGKILL, signal.SIGTERM):
                if self.restart_s is None:
                    self.down.add(name)
                else:
                    self.back_at[name] = time.monotonic() + self.restart_s

    def come_back(self, name: str) -> None:
        """From now on the worker serves again after each kill or term."""
        with self.lock:
            self.let_back.add(name)

    def generation(self, name: str) -> int:
        with self.lock:
            if name in self.down and name in self.let_back:
                self.down.discard(name)
                self.generations[name] += 1
            elif time.monotonic() >= self.back_at.get(name, float("inf")):
                del self.back_at[name]
                self.generations[name] += 1
            return self.generations[name]

    def restarted(self, name: str, since: int) -> bool:
        return self.generation(name) > since

    def stop(self) -> None:
        pass

    def describe(self) -> str:
        return "fake"

    def logs(self) -> Path:
        return Path("/nonexistent")


def run(fleet: FakeFleet, faults: tuple[Fault, ...], recovery_timeout_s: float = 5.0) -> Injector:
    injector = Injector(fleet, faults, recovery_timeout_s)
    injector.start()
    injector.join()
    return injector


def started(fleet: FakeFleet, faults: tuple[Fault, ...], max_down_per_role: int = 0) -> Injector:
    """Running, with a recovery timeout no test waits out (its workers come back when let)."""
    injector = Injector(fleet, faults, 600.0, max_down_per_role)
    injector.start()
    return injector


def signals(fleet: FakeFleet, name: str | None = None) -> list[int]:
    return [s for _, n, s in fleet.sent if name in (None, n)]


def apart(a, b) -> bool:
    """The two faults' spans do not overlap (whichever came first)."""
    return a.started_at >= b.ended_at or b.started_at >= a.ended_at


def test_a_stop_sends_sigstop_then_sigcont_after_its_pause():
    fleet = FakeFleet()
    injector = run(fleet, (Fault(0.05, FaultKind.STOP, "decode-0", stop_s=0.2),))
    (t0, n0, s0), (t1, n1, s1) = fleet.sent
    assert (n0, s0, n1, s1) == ("decode-0", signal.SIGSTOP, "decode-0", signal.SIGCONT)
    assert t1 - t0 >= 0.2
    record = injector.records[0]
    assert record.outcome is Outcome.RECOVERED and record.ended_at - record.started_at >= 0.2
    assert record.started_at - injector.t0 >= 0.05


def test_a_kill_ends_when_the_worker_serves_again_and_a_term_sends_sigterm():
    fleet = FakeFleet(restart_s=0.3)
    injector = run(fleet, (Fault(0.0, FaultKind.KILL, "decode-0"), Fault(0.0, FaultKind.TERM, "prefill-0")))
    assert sorted((n, s) for _, n, s in fleet.sent) == [("decode-0", signal.SIGKILL), ("prefill-0", signal.SIGTERM)]
    for record in injector.records:
        assert record.outcome is Outcome.RECOVERED
        assert record.ended_at - record.started_at >= 0.3
    assert fleet.generations == {"prefill-0": 2, "decode-0": 2, "decode-1": 1}


def test_a_worker_that_never_comes_back_is_not_recovered():
    injector = run(FakeFleet(restart_s=None), (Fault(0.0, FaultKind.KILL, "decode-0"),), recovery_timeout_s=0.3)
    assert injector.records[0].outcome is Outcome.NOT_RECOVERED


def test_a_second_fault_on_one_worker_waits_until_the_first_has_ended():
    fleet = FakeFleet(restart_s=None)
    injector = started(fleet, (Fault(0.0, FaultKind.KILL, "decode-0"), Fault(0.1, FaultKind.STOP, "decode-0", 0.05)))
    kill, stop = injector.records
    wait_until(lambda: kill.due_at and stop.due_at, 30, "both faults due")  # one of them goes on till let back
    fleet.come_back("decode-0")
    injector.join()
    assert apart(kill, stop)
    assert signals(fleet) in ([signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT],
                              [signal.SIGSTOP, signal.SIGCONT, signal.SIGKILL])


def test_faults_due_after_the_load_finished_are_skipped():
    fleet = FakeFleet()
    injector = started(fleet, (Fault(0.0, FaultKind.STOP, "decode-0", 0.05),
                               Fault(3600.0, FaultKind.KILL, "prefill-0")))
    wait_until(lambda: injector.records[0].ended_at, 30, "the first fault over")
    injector.load_finished()  # long before the second one's time
    injector.join()
    assert [r.outcome for r in injector.records] == [Outcome.RECOVERED, Outcome.SKIPPED]
    assert injector.records[1].started_at is None and injector.records[1].due_at is None
    assert all(name == "decode-0" for _, name, _ in fleet.sent)


def test_a_fault_due_during_the_load_but_queued_behind_a_slow_restart_is_still_injected():
    fleet = FakeFleet(restart_s=None)
    injector = started(fleet, (Fault(0.0, FaultKind.KILL, "decode-0"), Fault(0.1, FaultKind.TERM, "decode-0")))
    wait_until(lambda: all(r.due_at for r in injector.records), 30, "both faults due")
    injector.load_finished()  # while the first runs (its worker not back) and the second waits its turn
    finished_at = time.time()
    fleet.come_back("decode-0")
    injector.join()
    first, second = sorted(injector.records, key=lambda r: r.started_at)
    assert [r.outcome for r in injector.records] == [Outcome.RECOVERED, Outcome.RECOVERED]
    assert second.started_at >= max(first.ended_at, finished_at)
    assert sorted(signals(fleet)) == sorted([signal.SIGKILL, signal.SIGTERM])


def test_with_a_role_budget_of_one_a_fault_waits_until_its_role_has_no_worker_down():
    fleet = FakeFleet(restart_s=None)
    injector = started(fleet, (Fault(0.0, FaultKind.KILL, "decode-0"), Fault(0.1, FaultKind.STOP, "decode-1", 0.05),
                               Fault(0.1, FaultKind.STOP, "prefill-0", 0.05)), max_down_per_role=1)
    kill, other_decode, prefill = injector.records
    wait_until(lambda: kill.due_at and other_decode.due_at and prefill.ended_at, 30,
               "both decode faults due, the prefill one over")
    fleet.come_back("decode-0")
    injector.join()
    assert apart(kill, other_decode)  # one decode worker down at a time
    assert prefill.started_at < kill.ended_at  # another role's fault went on meanwhile


def test_without_a_budget_workers_of_one_role_go_down_together():
    fleet = FakeFleet(restart_s=None)
    injector = started(fleet, (Fault(0.0, FaultKind.KILL, "decode-0"), Fault(0.1, FaultKind.STOP, "decode-1", 0.05)))
    kill, stop = injector.records
    wait_until(lambda: kill.started_at and stop.ended_at, 30, "the kill under way, the stop over")
    fleet.come_back("decode-0")
    injector.join()
    assert stop.started_at < kill.ended_at


def test_a_worker_is_restarting_from_its_kill_until_it_serves_again_and_a_stopped_one_never_is():
    fleet = FakeFleet(restart_s=None)
    injector = started(fleet, (Fault(0.0, FaultKind.KILL, "decode-0"), Fault(0.0, FaultKind.STOP, "prefill-0", 0.5)))
    kill, stop = injector.records
    wait_until(lambda: kill.started_at and stop.started_at, 30, "the kill and the stop under way")
    assert injector.restarting() == {"decode-0"}
    fleet.come_back("decode-0")
    injector.join()
    assert injector.restarting() == set()
