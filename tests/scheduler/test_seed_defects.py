"""One test per defect of the seed article's scheduler sketch (see BRIEF.md); each fails on it."""

from __future__ import annotations

from pdserve.config import PreemptionConfig
from pdserve.requests import PreemptionMode, Priority, RequestState
from tests.scheduler.fakes import build, request, run_until_idle, step

NEVER_SWAP = PreemptionConfig(recompute_below_tokens=10**9, swap_above_tokens=10**9)


def test_freed_memory_is_exactly_the_victims_blocks_not_a_magic_count() -> None:
    s, ex, _ = build(num_blocks=9, prefix_cache=False, token_budget=64, max_chunk_tokens=64,
                     preemption=NEVER_SWAP)
    a, b = request("a", 16, max_tokens=30), request("b", 8, max_tokens=30)
    s.add(a)
    s.add(b)
    step(s, ex)
    while True:
        before_free = s.stats().kv.free
        held_by_b = len(s.kv.block_table("b"))
        grow_a = s.kv.num_new_blocks(a, 1)
        out, _ = step(s, ex)
        if out.preempted:
            break
    assert out.preempted[0].request is b
    assert s.stats().kv.free == before_free + held_by_b - grow_a
    assert s.stats().kv.active == len(s.kv.block_table("a"))


def test_victim_key_uses_admission_order_within_a_class() -> None:
    s, ex, _ = build(num_blocks=12, token_budget=64, max_chunk_tokens=64, preemption=NEVER_SWAP)
    for rid in ("first", "second", "third"):
        s.add(request(rid, 8, max_tokens=40))
        step(s, ex)
    victims = []
    while len(victims) < 2:
        out, _ = step(s, ex)
        victims += [p.request.request_id for p in out.preempted]
    assert victims[0] == "third"  # most recently admitted, not the first found


def test_admitting_several_waiting_requests_skips_none() -> None:
    s, ex, _ = build(token_budget=64, max_chunk_tokens=64, num_blocks=64)
    for i in range(6):
        s.add(request(f"r{i}", 8))
    out, _ = step(s, ex)
    assert [c.request.request_id for c in out.chunks] == [f"r{i}" for i in range(6)]
    assert s.stats().waiting == 0


def test_decodes_are_charged_the_blocks_they_grow_into() -> None:
    s, ex, _ = build(num_blocks=8, prefix_cache=False, token_budget=64, max_chunk_tokens=64,
                     preemption=NEVER_SWAP)
    a, b = request("a", 16, max_tokens=8), request("b", 15, max_tokens=8)
    s.add(a)
    s.add(b)
    step(s, ex)  # 4 + 4 blocks: the pool is full; a's next token (position 16) needs a fifth block
    assert s.stats().kv.free == 0
    out, _ = step(s, ex)
    chunk = next(c for c in out.chunks if c.request is a)
    assert chunk.start == 16 and len(chunk.block_table) == 5
    assert [p.request.request_id for p in out.preempted] == ["b"]


def test_victim_in_the_middle_of_its_prefill_is_resumed_correctly() -> None:
    s, ex, _ = build(num_blocks=8, token_budget=16, max_chunk_tokens=8, preemption=NEVER_SWAP,
                     aging_seconds=None)
    s.add(request("a", 4, max_tokens=40))  # a decoder admitted first, growing
    step(s, ex)
    p = request("p", 28, max_tokens=3)  # admitted later: the victim, mid-prefill
    s.add(p)
    while not p.num_preemptions:
        step(s, ex)
    assert p.state == RequestState.WAITING and p.num_computed_tokens == 0
    assert not s.kv.has_blocks("p")
    run_until_idle(s, ex)  # the fake executor checks p's context at every chunk
    assert p.is_finished and len(p.output_token_ids) == 3


def test_long_victims_are_swapped_not_recomputed() -> None:
    cfg = PreemptionConfig(recompute_below_tokens=8, swap_above_tokens=16)
    s, ex, _ = build(num_blocks=12, num_host_blocks=16, token_budget=64, max_chunk_tokens=64, preemption=cfg)
    s.add(request("a", 20, max_tokens=20))
    s.add(request("b", 20, max_tokens=20))
    while True:
        out, _ = step(s, ex)
        if out.preempted:
            break
    assert out.preempted[0].mode == PreemptionMode.SWAP and out.swap_out
    outs = run_until_idle(s, ex)
    assert any(o.swap_in for o in outs)


def test_prefill_chunks_only_the_tokens_the_prefix_cache_lacks() -> None:
    s, ex, _ = build(num_blocks=64, token_budget=64, max_chunk_tokens=64)
    shared = list(range(100, 140))
    s.add(request("a", prompt=shared + [1, 2], max_tokens=1))
    run_until_idle(s, ex)
    b = request("b", prompt=shared + [3, 4, 5], max_tokens=1)
    s.add(b)
    out, _ = step(s, ex)
    assert b.num_cached_tokens == 40 and [(c.start, c.num_tokens) for c in out.chunks] == [(40, 3)]


def saturate_with_normal(aging_seconds: float | None, steps: int) -> bool:
    """A BATCH request against an endless stream of NORMAL ones; True if it finished."""
    s, ex, clock = build(max_running=1, aging_seconds=aging_seconds)
    s.add(request("n-1", 4, max_tokens=2))
    batch = request("batch", 4, max_tokens=2, priority=Priority.BATCH)
    s.add(batch)
    for i in range(steps):
        s.add(request(f"n{i}", 4, max_tokens=2))
        step(s, ex, clock, dt=0.1)
    return batch.is_finished


def test_low_priority_cannot_starve_with_aging() -> None:
    assert saturate_with_normal(aging_seconds=1.0, steps=100)
    assert not saturate_with_normal(aging_seconds=None, steps=100)  # the defect, when aging is off
