"""A start's phase log: each phase the seconds since the one before, the first from the process's
start, and one line that sums them."""

from __future__ import annotations

import pytest

from pdserve.start_phases import IMPORTS, Phase, StartPhases, process_age_s


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.timeout(10)
def test_each_phase_is_the_time_since_the_one_before():
    clock = FakeClock()
    phases = StartPhases(clock)
    clock.now += 1.5
    assert phases.done("model") == 1.5
    clock.now += 0.25
    phases.done("probes")
    assert phases.phases == [Phase("model", 1.5), Phase("probes", 0.25)]
    assert phases.total_s == 1.75
    assert phases.summary() == "start 1.75 s: model 1.50, probes 0.25"


@pytest.mark.timeout(10)
def test_the_first_phase_runs_from_the_process_start():
    age = process_age_s()
    assert age is not None and age > 0.0
    phases = StartPhases.since_process_start()
    assert phases.phases[0].name == IMPORTS and phases.phases[0].seconds >= age
