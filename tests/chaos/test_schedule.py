"""The seeded fault schedule: reproducible, inside its window, never two faults on one worker at once."""

from __future__ import annotations

import pytest

from pdserve.chaos.scenarios import parse_schedule
from pdserve.chaos.fleet import role_of
from pdserve.chaos.schedule import (Fault, FaultKind, ScheduleSpec, format_schedule, overlap, parse_kinds, plan,
                                    spans_meet)

TARGETS = ("prefill-0", "prefill-1", "decode-0", "decode-1")
ALL_KINDS = tuple(FaultKind)


def spec(count: int = 10, window=(2.0, 120.0), **kw) -> ScheduleSpec:
    return ScheduleSpec(count, kw.pop("kinds", ALL_KINDS), kw.pop("targets", TARGETS), window, **kw)


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    assert plan(spec(), 7) == plan(spec(), 7)
    assert plan(spec(), 7) != plan(spec(), 8)


@pytest.mark.parametrize("seed", range(40))
def test_no_two_faults_reach_one_worker_at_once(seed):
    faults = plan(spec(recovery_s=30.0), seed)
    assert len(faults) == 10
    for i, a in enumerate(faults):
        for b in faults[i + 1:]:
            assert not overlap(a, b, 30.0), (a, b)
            if a.target == b.target:
                assert a.busy(30.0)[1] < b.at_s


@pytest.mark.parametrize("seed", range(40))
def test_by_default_at_most_one_worker_of_a_role_is_down_at_once(seed):
    faults = plan(spec(count=8, recovery_s=20.0), seed)
    for i, a in enumerate(faults):
        for b in faults[i + 1:]:
            if role_of(a.target) == role_of(b.target):
                assert not spans_meet(a, b, 20.0), (a, b)


def test_without_a_role_budget_workers_of_one_role_may_be_down_together():
    together = 0
    for seed in range(20):
        faults = plan(spec(count=8, recovery_s=20.0, max_down_per_role=0), seed)
        together += any(spans_meet(a, b, 20.0) and a.target != b.target and role_of(a.target) == role_of(b.target)
                        for i, a in enumerate(faults) for b in faults[i + 1:])
    assert together > 0


def test_a_budget_of_two_lets_two_of_a_role_down_but_never_three():
    for seed in range(20):
        faults = plan(spec(count=9, targets=("decode-0", "decode-1", "decode-2"), recovery_s=20.0,
                           max_down_per_role=2), seed)
        down_at = [sum(g.busy(20.0)[0] <= f.at_s <= g.busy(20.0)[1] for g in faults) for f in faults]
        assert max(down_at) <= 2


@pytest.mark.parametrize("seed", range(10))
def test_faults_are_in_time_order_within_the_window_with_the_given_kinds_and_targets(seed):
    faults = plan(spec(count=6, kinds=(FaultKind.STOP, FaultKind.KILL), targets=TARGETS[2:], stop_s=(3.0, 15.0)),
                  seed)
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)
    assert all(2.0 <= f.at_s <= 120.0 for f in faults)
    assert {f.kind for f in faults} <= {FaultKind.STOP, FaultKind.KILL}
    assert {f.target for f in faults} <= set(TARGETS[2:])
    for f in faults:
        assert (3.0 <= f.stop_s <= 15.0) if f.kind is FaultKind.STOP else f.stop_s == 0.0


def test_every_kind_and_worker_shows_up_over_a_long_schedule():
    faults = plan(spec(count=12, window=(0.0, 900.0)), 3)
    assert {f.kind for f in faults} == set(FaultKind)
    assert {f.target for f in faults} == set(TARGETS)


def test_a_schedule_that_cannot_fit_is_refused():
    with pytest.raises(ValueError, match="cannot place 3 faults"):
        plan(spec(count=3, window=(0.0, 10.0), kinds=(FaultKind.KILL,), targets=("decode-0",)), 0)


def test_overlap_counts_a_stop_until_its_sigcont_and_a_kill_for_the_recovery_time():
    stop = Fault(10.0, FaultKind.STOP, "decode-0", stop_s=5.0)
    assert overlap(stop, Fault(14.0, FaultKind.KILL, "decode-0"), 30.0)
    assert not overlap(stop, Fault(15.5, FaultKind.KILL, "decode-0"), 30.0)
    assert not overlap(stop, Fault(12.0, FaultKind.KILL, "decode-1"), 30.0)
    assert overlap(Fault(0.0, FaultKind.KILL, "decode-0"), Fault(29.0, FaultKind.STOP, "decode-0", 3.0), 30.0)


def test_no_faults_is_an_empty_schedule():
    assert plan(spec(count=0), 0) == ()
    assert format_schedule(()) == "fault schedule: none"


def test_kinds_and_fixed_schedules_parse():
    assert parse_kinds("kill, term") == (FaultKind.KILL, FaultKind.TERM)
    with pytest.raises(ValueError, match="fault kinds are"):
        parse_kinds("kill,boom")
    assert parse_schedule("45:stop:prefill-0:4,30:kill:decode-1") == (
        Fault(30.0, FaultKind.KILL, "decode-1"), Fault(45.0, FaultKind.STOP, "prefill-0", 4.0))


def test_the_printed_schedule_names_time_kind_target_and_pause():
    text = format_schedule(plan(spec(count=3, kinds=(FaultKind.STOP,)), 1))
    assert text.startswith("fault schedule (3):")
    assert text.count(" stop ") == 3 and " s  stop  " in text and "for " in text
