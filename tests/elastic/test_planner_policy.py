"""The planner's policy: which worker changes role, when, and when not (hysteresis, cooldown, the
last worker of a role, workers that cannot change)."""

from __future__ import annotations

import dataclasses
import math

from pdserve.elastic import FleetSignals, PlannerPolicy, WorkerSignals


def _w(address: str, role: str, elastic: bool = True, changing: bool = False, queued: int = 0, rate: float = 1000.0,
       running: int = 0, waiting: int = 0, free: int = 100, total: int = 100, step_s: float = 0.02) -> WorkerSignals:
    return WorkerSignals(address, role, elastic, changing, queued, rate, running, waiting, free, total, step_s)


def _observe(policy: PlannerPolicy, fleet: FleetSignals, times: int, start: float = 0.0):
    changes = [policy.observe(fleet, start + t) for t in range(times)]
    return [c for c in changes if c is not None]


BACKLOG = FleetSignals((_w("p0", "prefill", elastic=False, queued=5000), _w("d0", "decode", running=3),
                        _w("d1", "decode", running=1)))


def test_a_prefill_backlog_with_decode_slack_moves_the_least_busy_elastic_decode_worker():
    assert BACKLOG.prefill_backlog_s == 5.0 and BACKLOG.decode_occupancy == 0.0
    policy = PlannerPolicy(confirm=3)
    assert [policy.observe(BACKLOG, t) for t in range(2)] == [None, None]  # not confirmed yet
    change = policy.observe(BACKLOG, 2)
    assert (change.address, change.from_role, change.to_role, change.reason) == ("d1", "decode", "prefill",
                                                                                   "prefill_backlog")
    assert change.figures["prefill_backlog_s"] == 5.0 and "d1 from decode to prefill" in change.describe()


def test_nothing_changes_while_a_change_is_under_way_and_nothing_undoes_one_within_the_cooldown():
    policy = PlannerPolicy(confirm=1, cooldown_s=10.0)
    assert policy.observe(BACKLOG, 0.0).to_role == "prefill"
    changing = FleetSignals((*BACKLOG.workers[:2], _w("d1", "decode", changing=True)))
    assert policy.observe(changing, 1.0) is None
    moved = FleetSignals((_w("p0", "prefill", elastic=False), _w("d1", "prefill"), _w("d0", "decode", waiting=3)))
    assert _observe(policy, moved, 8, start=1.5) == []  # decode pressure, but within 10 s of the move to prefill
    assert policy.observe(moved, 10.5).to_role == "decode"


def test_a_burst_may_take_a_second_worker_in_the_same_direction_within_the_cooldown():
    fleet = FleetSignals((_w("p0", "prefill", elastic=False, queued=20000), *(_w(f"d{i}", "decode") for i in range(4))))
    policy = PlannerPolicy(confirm=2, cooldown_s=30.0)
    changes = _observe(policy, fleet, 6)
    assert [c.to_role for c in changes] == ["prefill"] * 3  # every second observation: confirmed afresh


def test_the_decode_side_spares_a_worker_only_if_the_others_could_carry_its_load():
    def fleet(free: int, step_s: float) -> FleetSignals:
        return FleetSignals((_w("p0", "prefill", elastic=False, queued=5000), _w("d0", "decode", free=free, step_s=step_s),
                             _w("d1", "decode", free=free, step_s=step_s)))

    assert PlannerPolicy(confirm=1).observe(fleet(free=75, step_s=0.02), 0.0) is not None  # 25 % -> 50 %
    assert PlannerPolicy(confirm=1).observe(fleet(free=70, step_s=0.02), 0.0) is None  # 30 % -> 60 %
    assert PlannerPolicy(confirm=1, tbt_objective_s=0.05).observe(fleet(free=100, step_s=0.02), 0.0) is not None
    assert PlannerPolicy(confirm=1, tbt_objective_s=0.05).observe(fleet(free=100, step_s=0.03), 0.0) is None


def test_the_last_worker_of_a_role_and_workers_that_cannot_change_stay():
    policy = PlannerPolicy(confirm=1)
    alone = FleetSignals((_w("p0", "prefill", queued=9000), _w("d0", "decode")))
    assert _observe(policy, alone, 5) == []
    fixed = FleetSignals((_w("p0", "prefill", queued=9000), _w("d0", "decode", elastic=False),
                          _w("d1", "decode", elastic=False)))
    assert _observe(policy, fixed, 5) == []


def test_decode_pressure_with_a_short_prefill_backlog_moves_an_elastic_prefill_worker():
    waiting = FleetSignals((_w("p0", "prefill", queued=100), _w("p1", "prefill", queued=10),
                            _w("d0", "decode", waiting=2, free=5)))
    change = PlannerPolicy(confirm=1).observe(waiting, 0.0)
    assert (change.address, change.to_role, change.reason) == ("p1", "decode", "decode_waiting")
    full = FleetSignals((_w("p0", "prefill"), _w("p1", "prefill"), _w("d0", "decode", free=10)))
    assert PlannerPolicy(confirm=1).observe(full, 0.0).reason == "decode_occupancy"
    slow = FleetSignals((_w("p0", "prefill"), _w("p1", "prefill"), _w("d0", "decode", step_s=0.3)))
    assert PlannerPolicy(confirm=1).observe(slow, 0.0) is None  # no TBT objective: steps are not pressure
    assert PlannerPolicy(confirm=1, tbt_objective_s=0.1).observe(slow, 0.0).reason == "decode_tbt"


def test_a_condition_that_flickers_is_never_confirmed():
    calm = FleetSignals((_w("p0", "prefill"), _w("d0", "decode"), _w("d1", "decode")))
    policy = PlannerPolicy(confirm=3)
    assert [policy.observe(BACKLOG if t % 2 == 0 else calm, t) for t in range(10)] == [None] * 10
    assert math.isinf(FleetSignals((_w("d0", "decode"),)).prefill_backlog_s)


def test_prompts_whose_kv_waits_on_a_prefill_worker_for_decode_blocks_count_as_decode_waiting():
    """With the reservation taken when the prefill starts, a request short of decode blocks waits
    on its prefill worker, not in a decode worker's queue: the planner sees it all the same."""
    held = dataclasses.replace(_w("p0", "prefill"), awaiting_target=4)
    fleet = FleetSignals((held, _w("d0", "decode", waiting=1), _w("d1", "decode")))
    assert fleet.decode_waiting == 5
