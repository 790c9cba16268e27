"""Aging lifts a request while it waits, not while it runs; a hand-over keeps the place its age gives it.

The case behind these: a decode worker died, and its streams are resumed on a survivor whose pool
is full of chats that have run for longer than `aging_seconds`. A resumed VIP must still preempt
them, and a resumed stream must not queue behind requests that arrived after it did.
"""

from __future__ import annotations

from pdserve.config import PreemptionConfig
from pdserve.requests import Priority, RequestState
from tests.scheduler.fakes import build, request, run_until_idle, step

NEVER_SWAP = PreemptionConfig(recompute_below_tokens=10**9, swap_above_tokens=10**9)


def _fill(s, ex, clock, rids: list[str], priority: Priority = Priority.NORMAL) -> None:
    for rid in rids:
        s.add(request(rid, 14, max_tokens=200, priority=priority))
    step(s, ex)
    assert all(s.get(rid).state == RequestState.RUNNING for rid in rids)


def test_a_vip_preempts_a_chat_that_has_run_longer_than_the_aging_period() -> None:
    s, ex, clock = build(num_blocks=10, token_budget=64, max_chunk_tokens=64, preemption=NEVER_SWAP,
                         aging_seconds=1.0)
    _fill(s, ex, clock, ["n1", "n2"])  # 4 blocks each, 5 once they grow: the pool is full
    for _ in range(3):
        clock.advance(1.0)
        step(s, ex)  # they run 3 s: three aging periods, and still rank as NORMAL
    s.add(request("vip", 12, max_tokens=2, priority=Priority.VIP))
    out, _ = step(s, ex)
    assert [(p.request.request_id, p.reason) for p in out.preempted] == [("n2", "higher_priority_waiting")]
    assert s.get("vip").state == RequestState.RUNNING
    run_until_idle(s, ex)


def test_a_request_lifted_while_it_waited_keeps_its_lift_while_it_runs() -> None:
    # b (BATCH) waited two periods before it was admitted: it runs at VIP rank, and a NORMAL
    # arriving after does not preempt it (nor would b, preempted, take its place back)
    s, ex, clock = build(num_blocks=16, token_budget=64, max_chunk_tokens=64, preemption=NEVER_SWAP,
                         aging_seconds=1.0)
    s.add(request("b", 56, max_tokens=200, priority=Priority.BATCH))  # 14 of the 16 blocks
    clock.advance(2.5)
    step(s, ex)
    assert s.get("b").state == RequestState.RUNNING
    s.add(request("n", 12, max_tokens=2))
    for _ in range(5):
        out, _ = step(s, ex)
        assert not out.preempted
    assert s.get("n").state == RequestState.WAITING


def test_a_handed_over_request_enters_the_queue_as_old_as_its_age() -> None:
    # one request runs at a time; w1 and w2 arrived before the hand-over but after its age
    # began, so it is served first
    s, ex, clock = build(num_blocks=6, token_budget=64, max_chunk_tokens=64, max_running=1,
                         preemption=NEVER_SWAP, aging_seconds=10.0)
    s.add(request("w1", 8, max_tokens=2))
    clock.advance(1.0)
    s.add(request("w2", 8, max_tokens=2))
    handed = request("handed_over", 8, max_tokens=2)
    handed.age_s = 12.0
    s.add(handed)
    order = []
    while s.has_work():
        out, _ = step(s, ex)
        order += [c.request.request_id for c in out.chunks if c.start == 0]
    assert order == ["handed_over", "w1", "w2"]


def test_an_old_hand_over_does_not_preempt_running_requests_of_its_class() -> None:
    # a retry placed 40 s after it arrived (aging 1 s) waits for room: it does not stall the
    # stream of its class already running
    s, ex, clock = build(num_blocks=8, token_budget=64, max_chunk_tokens=64, preemption=NEVER_SWAP,
                         aging_seconds=1.0)
    _fill(s, ex, clock, ["n1", "n2"])
    retried = request("retried", 12, max_tokens=2)
    retried.age_s = 40.0
    s.add(retried)
    for _ in range(5):
        out, _ = step(s, ex)
        assert not [p for p in out.preempted if p.reason == "higher_priority_waiting"]


def test_a_preempted_stream_resumes_before_new_requests_of_its_class() -> None:
    s, ex, clock = build(num_blocks=10, token_budget=64, max_chunk_tokens=64, preemption=NEVER_SWAP,
                         aging_seconds=1.0)
    _fill(s, ex, clock, ["n1", "n2"])
    clock.advance(0.5)
    s.add(request("new", 12, max_tokens=2))  # waits: the pool is full
    clock.advance(0.4)
    s.add(request("vip", 12, max_tokens=2, priority=Priority.VIP))
    out, _ = step(s, ex, clock)
    (victim,) = [p.request.request_id for p in out.preempted]
    order = []
    while s.has_work():
        out, _ = step(s, ex, clock)
        order += [c.request.request_id for c in out.chunks if c.request.request_id in (victim, "new")]
    assert order.index(victim) < order.index("new")


def test_a_stream_begun_elsewhere_goes_before_a_new_request_that_entered_earlier() -> None:
    s, ex, clock = build(num_blocks=16, token_budget=64, max_chunk_tokens=64, max_running=1)
    s.add(request("new", 8, max_tokens=2))
    clock.advance(0.5)
    resumed = request("resumed", 8, max_tokens=6)
    resumed.output_token_ids += [5, 6]  # no age: it entered after "new"
    s.add(resumed)
    out, _ = step(s, ex)
    assert [c.request.request_id for c in out.chunks] == ["resumed"]


def test_a_handed_over_vip_is_reserved_before_vips_that_arrived_after_it() -> None:
    s, ex, clock = build(num_blocks=16, token_budget=64, max_chunk_tokens=64, max_running=1)
    s.add_remote(request("later", 8, max_tokens=2, priority=Priority.VIP))
    resumed = request("resumed", 8, max_tokens=8, priority=Priority.VIP)
    resumed.output_token_ids += [5, 6, 7]
    resumed.age_s = 4.0
    s.add_remote(resumed, kv_tokens=resumed.num_tokens - 1)
    step(s, ex)
    assert [r.request.request_id for r in s.take_reserved()] == ["resumed"]
