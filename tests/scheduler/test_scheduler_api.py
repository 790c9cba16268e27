"""The public API: queueing, update, stop conditions, finish, abort, stats."""

from __future__ import annotations

import pytest

from pdserve.requests import FinishReason, RequestState
from pdserve.scheduler import DuplicateRequestError, PromptTooLongError, QueueFullError
from tests.scheduler.fakes import build, request, run_until_idle, step


def test_add_assigns_arrival_order_and_refuses_beyond_max_waiting() -> None:
    s, _, _ = build(max_waiting=2)
    a, b = request("a"), request("b")
    s.add(a)
    s.add(b)
    assert (a.arrival_seq, b.arrival_seq) == (0, 1)
    with pytest.raises(QueueFullError):
        s.add(request("c"))
    assert s.get("c") is None and s.stats().waiting == 2


def test_duplicate_ids_and_overlong_prompts_are_refused() -> None:
    s, _, _ = build(max_model_len=16)
    s.add(request("a"))
    with pytest.raises(DuplicateRequestError):
        s.add(request("a"))
    with pytest.raises(PromptTooLongError):
        s.add(request("b", 16))


def test_update_advances_chunks_and_appends_sampled_tokens() -> None:
    s, ex, _ = build(token_budget=64, max_chunk_tokens=6)
    r = request("a", 10, max_tokens=3)
    s.add(r)
    expected = [[(0, 6, False)], [(6, 4, True)], [(10, 1, True)]]
    for computed, output_len, chunks in zip((6, 10, 11), (0, 1, 2), expected):
        out = s.schedule()
        assert [(c.start, c.num_tokens, c.samples) for c in out.chunks] == chunks  # read before update
        s.update(out, ex.execute(out))
        assert r.num_computed_tokens == computed and len(r.output_token_ids) == output_len
    assert r.output_token_ids[0] == 1000 + (0 * 7 + 1) % 97  # the fake executor's token


@pytest.mark.parametrize("sampling, sampled, reason, length", [
    ({}, 2, FinishReason.STOP, 1),                               # eos
    ({"ignore_eos": True}, 2, FinishReason.LENGTH, 5),           # eos ignored: runs to max_tokens
    ({"stop_token_ids": (1007,)}, 1007, FinishReason.STOP, 1),   # stop token
    ({}, 1234, FinishReason.LENGTH, 5),                          # max_tokens
])
def test_stop_conditions(sampling: dict, sampled: int, reason: FinishReason, length: int) -> None:
    s, ex, _ = build()
    ex.sample = lambda r: sampled
    r = request("a", 6, max_tokens=5, **sampling)
    r.eos_token_ids = (2,)
    s.add(r)
    run_until_idle(s, ex)
    assert r.finish_reason == reason and len(r.output_token_ids) == length
    assert r.state == RequestState.FINISHED and s.stats().kv.active == 0


def test_context_limit_finishes_with_length() -> None:
    s, ex, _ = build(max_model_len=12)
    r = request("a", 8, max_tokens=100)
    s.add(r)
    run_until_idle(s, ex)
    assert r.finish_reason == FinishReason.LENGTH and r.num_tokens == 12


def test_finish_from_the_engine_frees_blocks_and_is_reported_next_step() -> None:
    s, ex, _ = build()
    r = request("a", 8, max_tokens=50)
    s.add(r)
    step(s, ex)
    assert s.finish("a", FinishReason.STOP) is r
    assert r.finish_reason == FinishReason.STOP and s.stats().kv.active == 0
    out, _ = step(s, ex)
    assert out.finished == (r,) and not out.chunks
    assert s.finish("a", FinishReason.STOP) is None


@pytest.mark.parametrize("steps_before", [0, 1, 3])
def test_abort_in_any_state_frees_every_block(steps_before: int) -> None:
    s, ex, _ = build(num_blocks=12, num_host_blocks=16, token_budget=64, max_chunk_tokens=64)
    long = request("long", 28, max_tokens=20)
    s.add(long)
    step(s, ex)
    for i in range(steps_before):
        s.add(request(f"x{i}", 12, max_tokens=20))
        step(s, ex)
    aborted = s.abort("long")
    assert aborted is long and long.finish_reason == FinishReason.ABORT
    s.check_integrity()
    assert s.abort("long") is None
    run_until_idle(s, ex)
    stats = s.stats()
    assert stats.kv.active == 0 and stats.kv.swapped == 0


def test_abort_of_a_swapped_request_frees_its_host_blocks() -> None:
    from pdserve.config import PreemptionConfig
    s, ex, _ = build(num_blocks=10, num_host_blocks=16, token_budget=64, max_chunk_tokens=64,
                     preemption=PreemptionConfig(recompute_below_tokens=0, swap_above_tokens=0))
    a, b = request("a", 16, max_tokens=30), request("b", 16, max_tokens=30)
    s.add(a)
    s.add(b)
    while b.state != RequestState.SWAPPED:
        step(s, ex)
    assert s.stats().kv.swapped > 0
    s.abort("b")
    assert s.stats().kv.swapped == 0
    s.check_integrity()


def test_stats_and_has_work() -> None:
    s, ex, _ = build()
    assert not s.has_work()
    s.add(request("a", 8, max_tokens=2))
    s.add(request("b", 8, max_tokens=2))
    assert s.has_work() and s.stats().waiting == 2
    step(s, ex)
    st = s.stats()
    assert (st.running, st.waiting, st.swapped) == (2, 0, 0) and st.kv.active == 4
    run_until_idle(s, ex)
    assert not s.has_work() and s.stats().kv.active == 0
