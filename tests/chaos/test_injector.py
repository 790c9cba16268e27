"""The injector against an in-memory fleet: signals in order, restarts awaited, faults serialised per worker."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from pdserve.chaos.fleet import Fleet, WorkerRef
from pdserve.chaos.injector import Injector, Outcome
from pdserve.chaos.schedule import Fault, FaultKind


class FakeFleet(Fleet):
    """Records every signal; a killed or terminated worker is back `restart_s` later (never when None)."""

    def __init__(self, restart_s: float | None = 0.05):
        self.restart_s = restart_s
        self.sent: list[tuple[float, str, int]] = []
        self.generations = {"prefill-0": 1, "decode-0": 1, "decode-1": 1}
        self.back_at: dict[str, float] = {}
        self.lock = threading.Lock()

    def start(self) -> str:
        return "127.0.0.1:1"

    def workers(self) -> tuple[WorkerRef, ...]:
        return tuple(WorkerRef(n, n.split("-")[0], f"127.0.0.1:{i + 2}") for i, n in enumerate(self.generations))

    def signal(self, name: str, sig: int) -> None:
        with self.lock:
            self.sent.append((time.monotonic(), name, sig))
            if sig in (signal.SIGKILL, signal.SIGTERM) and self.restart_s is not None:
                self.back_at[name] = time.monotonic() + self.restart_s

    def generation(self, name: str) -> int:
        with self.lock:
            if time.monotonic() >= self.back_at.get(name, float("inf")):
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


def run(fleet: FakeFleet, faults: tuple[Fault, ...], finish_after_s: float | None = None,
        recovery_timeout_s: float = 5.0, max_down_per_role: int = 0) -> Injector:
    injector = Injector(fleet, faults, recovery_timeout_s, max_down_per_role)
    injector.start()
    if finish_after_s is not None:
        time.sleep(finish_after_s)
        injector.load_finished()
    injector.join()
    return injector


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
    fleet = FakeFleet(restart_s=0.4)
    injector = run(fleet, (Fault(0.0, FaultKind.KILL, "decode-0"), Fault(0.1, FaultKind.STOP, "decode-0", 0.05)))
    kill, stop = injector.records
    assert stop.started_at >= kill.ended_at
    assert [s for _, _, s in fleet.sent] == [signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT]


def test_faults_due_after_the_load_finished_are_skipped():
    fleet = FakeFleet()
    injector = run(fleet, (Fault(0.0, FaultKind.STOP, "decode-0", 0.05), Fault(5.0, FaultKind.KILL, "prefill-0")),
                   finish_after_s=0.3)
    assert [r.outcome for r in injector.records] == [Outcome.RECOVERED, Outcome.SKIPPED]
    assert injector.records[1].started_at is None
    assert all(name == "decode-0" for _, name, _ in fleet.sent)


def test_a_fault_due_during_the_load_but_queued_behind_a_slow_restart_is_still_injected():
    fleet = FakeFleet(restart_s=0.6)
    injector = run(fleet, (Fault(0.0, FaultKind.KILL, "decode-0"), Fault(0.1, FaultKind.TERM, "decode-0")),
                   finish_after_s=0.3)
    kill, term = injector.records
    assert (kill.outcome, term.outcome) == (Outcome.RECOVERED, Outcome.RECOVERED)
    assert term.started_at >= kill.ended_at
    assert [s for _, _, s in fleet.sent] == [signal.SIGKILL, signal.SIGTERM]


def test_with_a_role_budget_of_one_a_fault_waits_until_its_role_has_no_worker_down():
    fleet = FakeFleet(restart_s=0.4)
    injector = run(fleet, (Fault(0.0, FaultKind.KILL, "decode-0"), Fault(0.1, FaultKind.STOP, "decode-1", 0.05),
                           Fault(0.1, FaultKind.STOP, "prefill-0", 0.05)), max_down_per_role=1)
    kill, other_decode, prefill = injector.records
    assert other_decode.started_at >= kill.ended_at
    assert prefill.started_at < kill.ended_at


def test_without_a_budget_workers_of_one_role_go_down_together():
    injector = run(FakeFleet(restart_s=0.4), (Fault(0.0, FaultKind.KILL, "decode-0"),
                                              Fault(0.1, FaultKind.STOP, "decode-1", 0.05)))
    kill, stop = injector.records
    assert stop.started_at < kill.ended_at


def test_a_worker_is_restarting_from_its_kill_until_it_serves_again_and_a_stopped_one_never_is():
    fleet = FakeFleet(restart_s=0.5)
    injector = Injector(fleet, (Fault(0.0, FaultKind.KILL, "decode-0"), Fault(0.0, FaultKind.STOP, "prefill-0", 0.5)),
                        5.0)
    injector.start()
    time.sleep(0.2)
    assert injector.restarting() == {"decode-0"}
    injector.join()
    assert injector.restarting() == set()
