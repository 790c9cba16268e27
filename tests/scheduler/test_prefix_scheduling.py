"""The prefix-cache step of admission, at realistic sizes."""

from __future__ import annotations

from pdserve.requests import RequestState
from tests.scheduler.fakes import build, request, run_until_idle, step

SYSTEM = [(i * 13) % 4000 + 5 for i in range(1000)]


def test_second_request_sharing_a_1000_token_prefix_computes_only_its_new_tokens() -> None:
    s, ex, _ = build(block_size=16, num_blocks=512, token_budget=2048, max_chunk_tokens=1024)
    first = request("first", prompt=SYSTEM + [1, 2, 3, 4, 5], max_tokens=4)
    s.add(first)
    run_until_idle(s, ex)
    second = request("second", prompt=SYSTEM + [9] * 40, max_tokens=4)
    s.add(second)
    outputs = run_until_idle(s, ex)
    computed = sum(c.num_tokens for o in outputs for c in o.chunks if c.start < second.num_prompt_tokens)
    assert second.num_cached_tokens == 992  # 62 full blocks of 16
    assert computed == 1040 - 992  # only the uncached prompt tokens went through the model


def test_without_a_prefix_cache_the_whole_prompt_is_computed() -> None:
    s, ex, _ = build(block_size=16, num_blocks=512, token_budget=2048, max_chunk_tokens=1024, prefix_cache=False)
    s.add(request("first", prompt=SYSTEM + [1], max_tokens=1))
    run_until_idle(s, ex)
    second = request("second", prompt=SYSTEM + [9] * 40, max_tokens=1)
    s.add(second)
    outputs = run_until_idle(s, ex)
    assert second.num_cached_tokens == 0
    assert sum(o.num_tokens for o in outputs) == 1040


def test_concurrent_requests_share_blocks_once_the_first_prefill_is_done() -> None:
    s, ex, _ = build(block_size=16, num_blocks=512, token_budget=2048, max_chunk_tokens=1024)
    a = request("a", prompt=SYSTEM + [1], max_tokens=20)
    s.add(a)
    step(s, ex)  # a's first 1024 tokens: 64 full blocks enter the cache as soon as they are computed
    b = request("b", prompt=SYSTEM + [2], max_tokens=20)
    s.add(b)
    step(s, ex)
    assert b.num_cached_tokens == 992 and b.state == RequestState.RUNNING
    assert s.kv.block_table("a")[:62] == s.kv.block_table("b")[:62]
    run_until_idle(s, ex)


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    s, ex, _ = build(block_size=16, num_blocks=512, token_budget=2048, max_chunk_tokens=1024)
    prompt = SYSTEM[:992]  # exactly 62 blocks
    s.add(request("a", prompt=prompt, max_tokens=1))
    run_until_idle(s, ex)
    again = request("b", prompt=list(prompt), max_tokens=1)
    s.add(again)
    out, _ = step(s, ex)
    assert [(c.start, c.num_tokens) for c in out.chunks] == [(976, 16)]
    assert len(again.output_token_ids) == 1
