"""Time slices within a class (pdserve/scheduler/slicing.py), on a fake clock.

The case behind them: a decode worker died and its VIP streams resume on a survivor whose pool
cannot hold every live VIP; a resumed stream (its client mid-stream) must not wait until another
VIP ends. Two requests run at a time here (max_running=2), so a slot is the room they share.
"""

from __future__ import annotations

import pytest

from pdserve.config import PreemptionConfig
from pdserve.requests import PreemptionMode, Priority, Request, RequestState
from pdserve.scheduler.preemptor import TIME_SLICE
from pdserve.scheduler.queue import Candidate, Group
from pdserve.scheduler.slicing import StartedStreamSlices
from pdserve.scheduler.state import Admission
from tests.scheduler.fakes import build, request, run_until_idle, step

NEVER_SWAP = PreemptionConfig(recompute_below_tokens=10**9, swap_above_tokens=10**9)
DT = 0.25  # seconds per step (exact in binary: the quantum boundaries fall on steps)
QUANTUM_S = 1.0  # the time slice these tests run (--time-slice-s 1)


def _resumed(rid: str, priority: Priority = Priority.NORMAL, age_s: float = 0.0) -> Request:
    """A stream begun elsewhere (two tokens out already), handed over `age_s` after it arrived."""
    r = request(rid, 8, max_tokens=200, priority=priority)
    r.output_token_ids += [5, 6]
    r.age_s = age_s
    return r


def _two_running(**kw):
    """n1 admitted at 0.0 s, n2 at 0.5 s; both stream long; now is 1.5 s."""
    kw.setdefault("time_slice_s", QUANTUM_S)  # (the default too; the tests do not depend on it)
    s, ex, clock = build(max_running=2, num_blocks=256, token_budget=64, max_chunk_tokens=64, **kw)
    s.add(request("n1", 8, max_tokens=400))
    _slices_until(s, ex, clock, 0.5)
    s.add(request("n2", 8, max_tokens=400))
    _slices_until(s, ex, clock, 1.5)
    assert s.get("n2").state == RequestState.RUNNING
    return s, ex, clock


def _slices_until(s, ex, clock, until: float) -> list[tuple[float, str]]:
    """(time, victim) of every time slice taken from now until `until`."""
    taken = []
    while clock.now < until - 1e-9:
        now = clock.now
        out, _ = step(s, ex, clock, DT)
        taken += [(round(now, 3), p.request.request_id) for p in out.preempted if p.reason == TIME_SLICE]
    return taken


@pytest.mark.timeout(10)
def test_a_started_stream_waiting_a_quantum_takes_the_longest_running_ones_place() -> None:
    s, ex, clock = _two_running()
    s.add(_resumed("r"))  # at 1.5 s; the quantum is 1 s
    assert _slices_until(s, ex, clock, 2.5) == []
    out, _ = step(s, ex, clock, DT)
    assert [(p.request.request_id, p.reason) for p in out.preempted] == [("n1", TIME_SLICE)]
    assert s.get("r").state == RequestState.RUNNING and [c.request.request_id for c in out.chunks][-1] == "r"


@pytest.mark.timeout(10)
def test_a_new_request_does_not_take_a_slice_however_old() -> None:
    s, ex, clock = _two_running()
    old = request("old", 8, max_tokens=2)
    old.age_s = 40.0
    s.add(old)
    assert _slices_until(s, ex, clock, 5.0) == []
    assert s.get("old").state == RequestState.WAITING


@pytest.mark.timeout(10)
def test_a_hand_over_as_old_as_a_quantum_takes_a_slice_at_once() -> None:
    s, ex, clock = _two_running()
    s.add(_resumed("r", age_s=3.0))  # its client has waited since before it came here
    out, _ = step(s, ex, clock, DT)
    assert [(p.request.request_id, p.reason) for p in out.preempted] == [("n1", TIME_SLICE)]


@pytest.mark.timeout(10)
def test_a_resumed_request_runs_a_quantum_before_it_is_taken_off_again() -> None:
    s, ex, clock = _two_running()
    s.add(_resumed("r"))
    taken = _slices_until(s, ex, clock, 6.0)
    # n1 off at 2.5 (r in); n1 waited 1 s and takes n2's place (n2 has run longest, r 1 s);
    # n2 waited 1 s: r has run 2 s, n1 1 s: r goes; and so on, each off after a quantum of running
    assert taken == [(2.5, "n1"), (3.5, "n2"), (4.5, "r"), (5.5, "n1")]
    run_until_idle(s, ex, clock)


@pytest.mark.timeout(10)
def test_a_victim_is_not_taken_off_before_it_streamed_min_tokens() -> None:
    # the policy alone: "old" was admitted first but has sampled 3 tokens since (a recomputed
    # victim's prefill was long); "young" ran a quantum and 4 tokens: it is taken instead
    policy = StartedStreamSlices(quantum_s=1.0, min_tokens=4)
    old, young = _resumed("old"), _resumed("young")
    old.output_token_ids += [7, 7, 7]
    young.output_token_ids += [7, 7, 7, 7]
    admitted = {"old": Admission(1, 0.0, 0.0, 2), "young": Admission(1, 0.0, 8.0, 2)}
    head = Candidate(1, Group.RESUMING, 0.0, 0, _resumed("head"))
    pick = policy.pick(head, [old, young], (), lambda r: admitted[r.request_id], now=9.0)
    assert pick is young
    assert policy.pick(head, [old, young], (), lambda r: admitted[r.request_id], now=8.5) is None  # young: 0.5 s
    assert policy.pick(head, [old, young], ("young",), lambda r: admitted[r.request_id], now=9.0) is None


@pytest.mark.timeout(10)
def test_without_slices_a_started_stream_waits_for_room_as_before() -> None:
    s, ex, clock = _two_running(time_slice_s=None)
    s.add(_resumed("r", age_s=3.0))
    assert _slices_until(s, ex, clock, 5.0) == []
    assert s.get("r").state == RequestState.WAITING
    run_until_idle(s, ex, clock)


@pytest.mark.timeout(10)
def test_a_slice_victim_is_swapped_when_the_host_pool_holds_it_however_short() -> None:
    s, ex, clock = _two_running()  # recompute_below_tokens 2048 would recompute it for room
    s.add(_resumed("r", age_s=3.0))
    out, _ = step(s, ex, clock, DT)
    assert [p.mode for p in out.preempted] == [PreemptionMode.SWAP]
    assert _slices_until(s, ex, clock, 3.0)[0][1] == "n2"  # the swapped n1 claims in turn
    assert s.get("n1").state == RequestState.RUNNING
    run_until_idle(s, ex, clock)


@pytest.mark.timeout(10)
def test_a_lower_class_is_preempted_before_a_slice_is_taken() -> None:
    s, ex, clock = _two_running()
    s.add(request("v", 8, max_tokens=400, priority=Priority.VIP))  # takes n2's place: a higher class
    step(s, ex, clock, DT)
    s.add(_resumed("rv", Priority.VIP, age_s=3.0))
    out, _ = step(s, ex, clock, DT)
    assert [(p.request.request_id, p.reason) for p in out.preempted] == [("n1", "higher_priority_waiting")]


@pytest.mark.timeout(10)
def test_a_resumed_vip_the_vip_guard_refuses_takes_a_running_vips_slice() -> None:
    # worst case of a VIP: 8 + 20 tokens, 7 blocks of 4; two fit the 16-block pool, not three
    for slices, reserved in ((1.0, ["rv"]), (None, [])):
        s, ex, clock = build(num_blocks=16, token_budget=64, max_chunk_tokens=64, time_slice_s=slices)
        s.add(request("v1", 8, max_tokens=20, priority=Priority.VIP))
        s.add(request("v2", 8, max_tokens=20, priority=Priority.VIP))
        _slices_until(s, ex, clock, 2.0)  # 8 tokens each
        resumed = request("rv", 8, max_tokens=20, priority=Priority.VIP)
        resumed.output_token_ids += [5, 6]
        resumed.age_s = 3.0
        s.add_remote(resumed, kv_tokens=resumed.num_tokens - 1)
        out, _ = step(s, ex, clock, DT)
        assert [r.request.request_id for r in s.take_reserved()] == reserved
        assert [p.request.request_id for p in out.preempted] == (["v1"] if slices else [])
