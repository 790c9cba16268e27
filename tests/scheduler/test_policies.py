"""fcfs and decode-first against chunked on the same small situations."""

from __future__ import annotations

import pytest

from pdserve.requests import Priority
from pdserve.scheduler import POLICIES
from tests.scheduler.fakes import build, request, run_until_idle, step


def ids(output) -> list[str]:
    return [c.request.request_id for c in output.chunks]


def with_decoders(policy: str, n: int = 3):
    s, ex, clock = build(policy, token_budget=64, max_chunk_tokens=16, num_blocks=256, max_running=16)
    for i in range(n):
        s.add(request(f"d{i}", 4, max_tokens=40))
    step(s, ex)
    return s, ex


def test_fcfs_runs_a_prompt_longer_than_the_budget_whole_and_alone() -> None:
    s, ex = with_decoders("fcfs")
    s.add(request("long", 200))
    out, _ = step(s, ex)
    assert ids(out) == ["long"] and out.num_tokens == 200  # the decoders stall this step
    out, _ = step(s, ex)
    assert sorted(ids(out)) == ["d0", "d1", "d2", "long"]


def test_fcfs_packs_whole_prompts_that_fit_with_decodes() -> None:
    s, ex = with_decoders("fcfs")
    s.add(request("a", 30))
    s.add(request("b", 30))
    out, _ = step(s, ex)
    assert ids(out) == ["a", "b", "d0", "d1", "d2"] and out.num_tokens == 63


def test_fcfs_ignores_priorities() -> None:
    s, ex, _ = build("fcfs", token_budget=16, num_blocks=64)
    s.add(request("batch", 12, priority=Priority.BATCH))
    s.add(request("vip", 12, priority=Priority.VIP))
    assert ids(step(s, ex)[0]) == ["batch"]


def test_decode_first_blocks_prefill_while_anything_decodes() -> None:
    s, ex = with_decoders("decode-first")
    s.add(request("new", 8, max_tokens=2))
    for _ in range(39):
        out, _ = step(s, ex)
        assert "new" not in ids(out)
    out, _ = step(s, ex)  # the decoders finish at 40 tokens: prefill resumes
    out, _ = step(s, ex)
    assert ids(out) == ["new"]


def test_chunked_runs_prefill_chunks_beside_the_decodes() -> None:
    s, ex = with_decoders("chunked")
    s.add(request("long", 200))
    out, _ = step(s, ex)
    assert ids(out) == ["d0", "d1", "d2", "long"] and out.chunks[-1].num_tokens == 16


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_drains_a_mixed_load(policy: str) -> None:
    s, ex, clock = build(policy, token_budget=64, max_chunk_tokens=16, num_blocks=48, max_running=6)
    for i in range(12):
        s.add(request(f"r{i}", 5 + 7 * i, max_tokens=6, priority=Priority(i % 3)))
    run_until_idle(s, ex, clock)
    assert s.stats().kv.active == 0


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError):
        build("round-robin")


def test_fcfs_admission_leaves_the_blocks_its_decodes_grow_into() -> None:
    s, ex, _ = build("fcfs", num_blocks=6, token_budget=64, max_chunk_tokens=64)
    d = request("d", 8, max_tokens=10)
    s.add(d)
    step(s, ex)  # d's next token (position 8) needs a third block
    s.add(request("w", 16, max_tokens=2))  # would take the four free blocks
    out, _ = step(s, ex)
    assert not out.preempted and ids(out) == ["d"] and s.get("w").state.name == "WAITING"
    run_until_idle(s, ex)
