"""Remote requests (decode workers) and holds (prefill workers)."""

from __future__ import annotations

import pytest

from pdserve.requests import FinishReason, Priority, RequestState
from pdserve.scheduler import NotReceivingError
from tests.scheduler.fakes import build, request, run_until_idle, step


def deliver(ex, reservation, block_size: int = 4) -> None:
    """What the transport does: the prompt's KV lands in the reserved blocks past the cached ones."""
    r = reservation.request
    ex._write(r.prompt_token_ids, reservation.block_ids, reservation.cached_blocks * block_size, r.num_prompt_tokens)


def test_remote_request_reserves_prompt_blocks_then_decodes_once_received() -> None:
    s, ex, _ = build()
    r = request("r", 10, max_tokens=3)
    s.add_remote(r)
    out, _ = step(s, ex)
    assert not out.chunks
    (reservation,) = s.take_reserved()
    assert reservation.request is r and len(reservation.block_ids) == 3
    assert s.stats().receiving == 1 and s.stats().running == 0 and not s.has_work()
    step(s, ex)
    assert r.num_computed_tokens == 0 and s.take_reserved() == []
    deliver(ex, reservation)
    s.mark_received("r", first_token=777)
    assert r.output_token_ids == [777] and r.num_computed_tokens == 10
    out, _ = step(s, ex)
    assert [(c.start, c.num_tokens) for c in out.chunks] == [(10, 1)]
    run_until_idle(s, ex)
    assert r.finish_reason == FinishReason.LENGTH and len(r.output_token_ids) == 3


def test_first_token_may_come_with_the_request() -> None:
    s, ex, _ = build()
    r = request("r", 10, max_tokens=1)
    r.output_token_ids.append(5)
    s.add_remote(r)
    step(s, ex)
    s.mark_received("r")
    assert r.finish_reason == FinishReason.LENGTH  # max_tokens reached by the first token alone
    assert s.stats().kv.active == 0


def test_receiving_requests_are_never_preempted() -> None:
    s, ex, _ = build(num_blocks=8, token_budget=64, max_chunk_tokens=64)
    s.add_remote(request("remote", 12, max_tokens=5, priority=Priority.BATCH))
    step(s, ex)
    s.take_reserved()
    s.add(request("local", 16, max_tokens=20))
    for _ in range(20):
        out, _ = step(s, ex)
        assert "remote" not in {p.request.request_id for p in out.preempted}
    assert s.get("remote").state == RequestState.RUNNING


def test_remote_admission_may_preempt_a_lower_class() -> None:
    s, ex, _ = build(num_blocks=8, token_budget=64, max_chunk_tokens=64)
    s.add(request("batch", 24, max_tokens=30, priority=Priority.BATCH))
    step(s, ex)
    s.add_remote(request("vip", 12, max_tokens=3, priority=Priority.VIP))
    out, _ = step(s, ex)
    assert [p.request.request_id for p in out.preempted] == ["batch"]
    assert [x.request.request_id for x in s.take_reserved()] == ["vip"]


def test_abort_while_receiving_holds_the_blocks_until_released() -> None:
    s, ex, _ = build()
    s.add_remote(request("r", 10, max_tokens=3))
    step(s, ex)
    (reservation,) = s.take_reserved()
    s.abort("r")
    holds = s.take_holds()
    assert holds["r"].blocks == reservation.block_ids
    assert s.stats().kv.active == 3  # a transfer may still be writing into them
    s.check_integrity()
    s.release_hold(holds["r"])
    assert s.stats().kv.active == 0
    with pytest.raises(NotReceivingError):
        s.mark_received("r")


def test_hold_finished_keeps_a_prefill_workers_kv_until_released() -> None:
    s, ex, _ = build(hold_finished=True)
    r = request("p", 10, max_tokens=1)
    s.add(r)
    out, finished = step(s, ex)
    assert finished == [r]
    hold = s.take_holds()["p"]
    assert hold.blocks == out.chunks[0].block_table and hold.num_tokens == 10
    assert s.stats().kv.active == 3
    s.release_hold(hold)
    assert s.stats().kv.active == 0 and s.stats().kv.cached == 2  # full blocks stay cached


def test_hold_on_a_running_request_survives_its_preemption() -> None:
    s, ex, _ = build(num_blocks=8, token_budget=64, max_chunk_tokens=64)
    s.add(request("a", 12, max_tokens=30))
    s.add(request("b", 12, max_tokens=30))
    step(s, ex)
    hold = s.hold("b")
    table = hold.blocks
    while s.get("b").state == RequestState.RUNNING:
        step(s, ex)
    assert all(s.kv.device.refcount(block) >= 1 for block in table)
    s.release_hold(hold)
    s.check_integrity()
    assert s.hold("nobody") is None


def test_a_first_token_that_ends_the_request_is_reported_by_the_next_step() -> None:
    s, ex, _ = build()
    r = request("r", 10, max_tokens=1)
    s.add_remote(r)
    step(s, ex)
    s.take_reserved()
    s.mark_received("r", first_token=5)
    assert s.has_work()  # nothing to compute, but a finish to report
    out, _ = step(s, ex)
    assert [f.request_id for f in out.finished] == ["r"] and not out.chunks
    assert not s.has_work() and s.stats().kv.active == 0


def test_reserved_blocks_are_counted_while_their_kv_arrives() -> None:
    s, ex, _ = build()
    s.add_remote(request("r", 10, max_tokens=3))
    step(s, ex)
    s.take_reserved()
    assert s.stats().blocks_reserved == 3
    s.mark_received("r", first_token=5)
    assert s.stats().blocks_reserved == 0


def test_quarantine_keeps_only_the_unsafe_blocks_of_an_aborted_reservation() -> None:
    s, ex, _ = build()
    s.add_remote(request("r", 10, max_tokens=3))
    step(s, ex)
    (reservation,) = s.take_reserved()
    s.abort("r")
    hold = s.take_holds()["r"]
    quarantined = s.quarantine(hold, reservation.block_ids[1:2])
    stats = s.stats().kv
    assert quarantined.blocks == reservation.block_ids[1:2] and quarantined.quarantined
    assert (stats.active, stats.quarantined, stats.held) == (1, 1, 0)
    s.check_integrity()
    s.release_hold(quarantined)
    assert s.stats().kv.active == 0 and s.stats().kv.quarantined == 0
    s.check_integrity()


def test_a_remote_prompt_shares_the_cached_prefix_and_only_the_rest_is_written() -> None:
    s, ex, _ = build()
    first = request("first", prompt=list(range(1, 13)), max_tokens=2)
    s.add(first)
    run_until_idle(s, ex)  # its prompt's blocks stay in the prefix cache
    turn = request("turn", prompt=[*range(1, 13), 50, 51, 52, 53, 54], max_tokens=3)
    s.add_remote(turn)
    step(s, ex)
    (reservation,) = s.take_reserved()
    assert reservation.cached_blocks == 3 and turn.num_cached_tokens == 12
    assert s.stats().kv.cached == 0  # the three cached blocks are this request's now, shared
    deliver(ex, reservation, s.kv.block_size)  # blocks 3 and 4 only: the executor checks every read
    s.mark_received("turn", first_token=9)
    run_until_idle(s, ex)
    assert turn.finish_reason == FinishReason.LENGTH and len(turn.output_token_ids) == 3
    assert s.stats().kv.active == 0


def test_queued_prefill_tokens_count_what_this_worker_computes_not_what_it_receives() -> None:
    s, ex, _ = build(num_blocks=64, token_budget=8, max_chunk_tokens=8)
    s.add(request("a", 20, max_tokens=2))
    s.add(request("b", 12, max_tokens=2))
    s.add_remote(request("remote", 30, max_tokens=2))
    assert s.queued_prefill_tokens() == 32
    step(s, ex)  # 8 of a's tokens computed; the remote one reserved, not computed here
    assert s.queued_prefill_tokens() == 24
    run_until_idle(s, ex)
    assert s.queued_prefill_tokens() == 0
