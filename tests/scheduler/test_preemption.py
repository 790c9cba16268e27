"""Preemption: victims, VIP, same-step protection, queue place, mid-prefill victims, swap."""

from __future__ import annotations

from pdserve.config import PreemptionConfig
from pdserve.requests import PreemptionMode, Priority, RequestState
from tests.scheduler.fakes import build, request, run_until_idle, step

ALWAYS_SWAP = PreemptionConfig(recompute_below_tokens=0, swap_above_tokens=0)
NEVER_SWAP = PreemptionConfig(recompute_below_tokens=10**9, swap_above_tokens=10**9)


def grow_until_preemption(s, ex, max_steps: int = 100):
    for _ in range(max_steps):
        out, _ = step(s, ex)
        if out.preempted:
            return out
    raise AssertionError("no preemption happened")


def test_out_of_blocks_victim_is_the_most_recently_admitted_of_the_lowest_class() -> None:
    s, ex, _ = build(num_blocks=12, token_budget=64, max_chunk_tokens=64, preemption=NEVER_SWAP)
    for rid, prio in [("n1", Priority.NORMAL), ("b1", Priority.BATCH), ("b2", Priority.BATCH),
                      ("n2", Priority.NORMAL)]:
        s.add(request(rid, 8, max_tokens=40, priority=prio))
        step(s, ex)  # one admission per step: admit_seq follows the list
    out = grow_until_preemption(s, ex)
    assert [p.request.request_id for p in out.preempted][0] == "b2"
    assert out.preempted[0].reason == "out_of_blocks" and out.preempted[0].mode == PreemptionMode.RECOMPUTE


def test_vip_is_never_preempted_even_when_most_recent() -> None:
    s, ex, _ = build(num_blocks=10, token_budget=64, max_chunk_tokens=64, preemption=NEVER_SWAP)
    s.add(request("batch", 8, max_tokens=30, priority=Priority.BATCH))
    step(s, ex)
    s.add(request("vip", 8, max_tokens=30, priority=Priority.VIP))
    out = grow_until_preemption(s, ex)
    assert {p.request.request_id for p in out.preempted} == {"batch"}
    run_until_idle(s, ex)
    assert s.get("vip") is None


def test_higher_class_waiting_preempts_lower_running() -> None:
    s, ex, _ = build(num_blocks=8, token_budget=64, max_chunk_tokens=64, preemption=NEVER_SWAP)
    s.add(request("b1", 14, max_tokens=30, priority=Priority.BATCH))
    s.add(request("b2", 14, max_tokens=30, priority=Priority.BATCH))
    step(s, ex)
    s.add(request("vip", 12, max_tokens=2, priority=Priority.VIP))
    out, _ = step(s, ex)
    assert [(p.request.request_id, p.reason) for p in out.preempted] == [("b2", "higher_priority_waiting")]
    assert "vip" in {c.request.request_id for c in out.chunks}


def test_same_class_waiting_does_not_preempt() -> None:
    s, ex, _ = build(num_blocks=8, token_budget=64, max_chunk_tokens=64)
    s.add(request("a", 14, max_tokens=30))
    s.add(request("b", 14, max_tokens=30))
    step(s, ex)
    s.add(request("c", 12, max_tokens=2))
    out, _ = step(s, ex)
    assert not out.preempted and s.get("c").state == RequestState.WAITING


def test_a_request_scheduled_earlier_in_the_step_is_not_preempted_later() -> None:
    # b (BATCH, aged one class up while it waited) and n (NORMAL) share rank 1; n was admitted
    # later, so n is the policy's victim. But n decodes first in the step (NORMAL lane); when b
    # then needs a block, n is already in the step: b yields instead.
    s, ex, clock = build(num_blocks=6, token_budget=64, max_chunk_tokens=64, preemption=NEVER_SWAP,
                         aging_seconds=1.0)
    b = request("b", 4, max_tokens=30, priority=Priority.BATCH)
    s.add(b)
    clock.advance(1.5)
    step(s, ex)
    n = request("n", 9, max_tokens=30)
    s.add(n)
    out = grow_until_preemption(s, ex)
    assert n.admit_seq > b.admit_seq
    assert [x.request.request_id for x in out.preempted] == ["b"]
    assert "n" in {c.request.request_id for c in out.chunks} and n.state == RequestState.RUNNING
    run_until_idle(s, ex)


def test_a_higher_class_running_prefill_preempts_a_lower_class_before_decodes() -> None:
    # d (BATCH) decodes every step; p (NORMAL) is mid-prefill when the pool fills. d is
    # preempted before the decodes run, so p's next chunk gets its blocks.
    s, ex, _ = build(num_blocks=8, token_budget=16, max_chunk_tokens=8, preemption=NEVER_SWAP,
                     aging_seconds=None)
    d = request("d", 4, max_tokens=20, priority=Priority.BATCH)
    p = request("p", 28, max_tokens=2)
    s.add(d)
    s.add(p)
    out = grow_until_preemption(s, ex)
    assert [(x.request.request_id, x.reason) for x in out.preempted] == [("d", "higher_priority_waiting")]
    assert "p" in {c.request.request_id for c in out.chunks}
    run_until_idle(s, ex)
    assert p.is_finished and d.is_finished and p.num_preemptions == 0


def test_victim_mid_prefill_resumes_from_its_cached_blocks() -> None:
    s, ex, _ = build(num_blocks=8, token_budget=16, max_chunk_tokens=8, preemption=NEVER_SWAP,
                     aging_seconds=None)
    s.add(request("a", 4, max_tokens=5))  # a decoder admitted first; it needs one more block
    step(s, ex)
    p = request("p", 28, max_tokens=2)  # admitted later: the victim, mid-prefill
    s.add(p)
    grow_until_preemption(s, ex)
    assert p.num_computed_tokens == 0 and p.num_preemptions == 1
    starts = []
    while not p.is_finished:
        out, _ = step(s, ex)
        starts += [c.start for c in out.chunks if c.request is p]
    assert starts[0] == 24, "the resumed prefill recomputed blocks the prefix cache still held"


def test_victim_keeps_its_place_ahead_of_later_arrivals() -> None:
    s, ex, _ = build(num_blocks=8, token_budget=64, max_chunk_tokens=64, preemption=NEVER_SWAP, max_running=2)
    s.add(request("a", 12, max_tokens=30))
    s.add(request("b", 12, max_tokens=30))
    step(s, ex)
    s.add(request("late", 4, max_tokens=1))
    out = grow_until_preemption(s, ex)
    assert out.preempted[0].request.request_id == "b"
    order = []
    for out in run_until_idle(s, ex):
        order += [c.request.request_id for c in out.chunks if c.request.request_id in ("b", "late")]
    assert order.index("b") < order.index("late")


def test_swap_out_then_swap_in_restores_kv_before_new_admissions() -> None:
    s, ex, _ = build(num_blocks=10, num_host_blocks=16, token_budget=64, max_chunk_tokens=64,
                     preemption=ALWAYS_SWAP)
    a, b = request("a", 16, max_tokens=20), request("b", 16, max_tokens=20)
    s.add(a)
    s.add(b)
    out = grow_until_preemption(s, ex)
    (pre,) = out.preempted
    assert pre.request is b and pre.mode == PreemptionMode.SWAP and len(out.swap_out) >= 4
    assert b.state == RequestState.SWAPPED and b.num_computed_tokens > 0
    s.add(request("new", 8, max_tokens=2))
    while b.state == RequestState.SWAPPED:
        out, _ = step(s, ex)
        assert s.get("new").state == RequestState.WAITING or b.state == RequestState.RUNNING
    assert out.swap_in and b in out.resumed
    run_until_idle(s, ex)  # the fake executor checks b's KV on every later step
    assert b.is_finished and len(b.output_token_ids) == 20


def test_swap_falls_back_to_recompute_without_host_room() -> None:
    s, ex, _ = build(num_blocks=10, num_host_blocks=2, token_budget=64, max_chunk_tokens=64,
                     preemption=ALWAYS_SWAP)
    s.add(request("a", 16, max_tokens=20))
    s.add(request("b", 16, max_tokens=20))
    out = grow_until_preemption(s, ex)
    assert out.preempted[0].mode == PreemptionMode.RECOMPUTE and not out.swap_out
    run_until_idle(s, ex)


def test_victim_mid_prefill_can_be_swapped_and_resumed() -> None:
    s, ex, _ = build(num_blocks=8, num_host_blocks=16, token_budget=16, max_chunk_tokens=8,
                     preemption=ALWAYS_SWAP, aging_seconds=None)
    s.add(request("a", 4, max_tokens=40))  # a decoder admitted first, growing
    step(s, ex)
    p = request("p", 28, max_tokens=2)  # admitted later: the victim, mid-prefill
    s.add(p)
    out = grow_until_preemption(s, ex)
    assert out.preempted[0].request is p and p.state == RequestState.SWAPPED and p.is_prefilling
    computed = p.num_computed_tokens
    while p.state == RequestState.SWAPPED:
        out, _ = step(s, ex)
    resumed_chunks = [c for c in out.chunks if c.request is p]
    assert not resumed_chunks or resumed_chunks[0].start == computed
    run_until_idle(s, ex)
    assert p.is_finished


def test_a_request_waits_rather_than_preempting_itself_when_only_holds_pin_the_blocks() -> None:
    s, ex, _ = build(num_blocks=6, token_budget=64, max_chunk_tokens=64, hold_finished=True)
    s.add(request("h", 12, max_tokens=1))  # finishes at once; a transfer still reads its 3 blocks
    x = request("x", 11, max_tokens=10)
    s.add(x)
    step(s, ex)
    (hold,) = s.take_holds().values()
    step(s, ex)
    out, _ = step(s, ex)  # x's token 12 needs a fourth block: only the held ones are missing
    assert not out.preempted and not out.chunks and x.state == RequestState.RUNNING
    s.release_hold(hold)
    out, _ = step(s, ex)
    assert [(c.start, c.num_tokens) for c in out.chunks] == [(12, 1)] and x.num_preemptions == 0
    run_until_idle(s, ex)
    for held in s.take_holds().values():
        s.release_hold(held)
    assert s.stats().kv.active == 0
