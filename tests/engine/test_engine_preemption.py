"""Forced preemption: a KV pool that holds only the longest request, several requests at once.
Recompute and swap both give the tokens of an unpreempted run, and every block comes back."""

from __future__ import annotations

import pytest

from pdserve.config import PreemptionConfig
from pdserve.requests import PreemptionMode
from tests.engine.driver import GREEDY, Arrival, assert_all_blocks_released, make_engine, run, tiny_prompt

MODEL = "llama_gqa_llama3"
BLOCK_SIZE = 4
LENGTHS_AND_STARTS = ((60, 0), (47, 0), (33, 0), (5, 1), (21, 4))
TIGHT_BLOCKS = 20  # the longest request, 60 + 16 tokens, needs 19 blocks of 4

ALWAYS_RECOMPUTE = PreemptionConfig(recompute_below_tokens=10**9)
ALWAYS_SWAP = PreemptionConfig(recompute_below_tokens=0, swap_above_tokens=0)


def _arrivals(vocab_size: int) -> list[Arrival]:
    return [Arrival(f"r{n}", tiny_prompt(n, vocab_size, seed=n), at=at) for n, at in LENGTHS_AND_STARTS]


def _check_against_oracle(trace, arrivals, oracle) -> None:
    for arrival in arrivals:
        expected = oracle.greedy(MODEL, arrival.prompt, GREEDY.max_tokens)
        assert trace.tokens(arrival.request_id) == expected, arrival.request_id


@pytest.mark.parametrize(("num_host_blocks", "prefix_cache"), [(0, True), (0, False), (64, True)])
@pytest.mark.parametrize("max_chunk_tokens", [16, 1024])
def test_recompute_preemption_keeps_output(tiny_loaded, oracle, num_host_blocks, prefix_cache, max_chunk_tokens):
    loaded = tiny_loaded[MODEL]
    engine = make_engine(loaded, block_size=BLOCK_SIZE, num_blocks=TIGHT_BLOCKS, num_host_blocks=num_host_blocks,
                         prefix_cache=prefix_cache, max_chunk_tokens=max_chunk_tokens, preemption=ALWAYS_RECOMPUTE)
    arrivals = _arrivals(loaded.config.vocab_size)
    trace = run(engine, arrivals)
    assert trace.preemptions and trace.modes() == {PreemptionMode.RECOMPUTE}
    assert any(p.num_output_tokens > 0 for p in trace.preemptions), "no request was preempted while decoding"
    assert sum(r.num_preemptions for r in trace.requests.values()) == len(trace.preemptions)
    _check_against_oracle(trace, arrivals, oracle)
    assert_all_blocks_released(engine)


@pytest.mark.parametrize("prefix_cache", [True, False])
@pytest.mark.parametrize("max_chunk_tokens", [16, 1024])
def test_swap_preemption_keeps_output(tiny_loaded, oracle, prefix_cache, max_chunk_tokens):
    loaded = tiny_loaded[MODEL]
    engine = make_engine(loaded, block_size=BLOCK_SIZE, num_blocks=TIGHT_BLOCKS, num_host_blocks=64,
                         prefix_cache=prefix_cache, max_chunk_tokens=max_chunk_tokens, preemption=ALWAYS_SWAP)
    arrivals = _arrivals(loaded.config.vocab_size)
    trace = run(engine, arrivals)
    assert trace.preemptions and trace.modes() == {PreemptionMode.SWAP}
    assert any(p.num_output_tokens > 0 for p in trace.preemptions), "no request was preempted while decoding"
    assert {p.request.request_id for p in trace.preemptions} <= set(trace.resumed_ids)
    _check_against_oracle(trace, arrivals, oracle)
    assert_all_blocks_released(engine)
    assert engine.host_kv.num_blocks == 64 and engine.scheduler.stats().kv.swapped == 0


def test_small_host_pool_mixes_swap_and_recompute(tiny_loaded, oracle):
    """Victims that do not fit in the 6 host blocks left are recomputed instead."""
    loaded = tiny_loaded[MODEL]
    engine = make_engine(loaded, block_size=BLOCK_SIZE, num_blocks=TIGHT_BLOCKS, num_host_blocks=6,
                         max_chunk_tokens=16, preemption=ALWAYS_SWAP)
    arrivals = _arrivals(loaded.config.vocab_size)
    trace = run(engine, arrivals)
    assert trace.modes() == {PreemptionMode.SWAP, PreemptionMode.RECOMPUTE}
    _check_against_oracle(trace, arrivals, oracle)
    assert_all_blocks_released(engine)


@pytest.mark.parametrize("policy", ["fcfs", "decode-first"])
@pytest.mark.parametrize("preemption", [ALWAYS_RECOMPUTE, ALWAYS_SWAP], ids=["recompute", "swap"])
def test_other_policies_under_pressure(tiny_loaded, oracle, policy, preemption):
    loaded = tiny_loaded[MODEL]
    engine = make_engine(loaded, block_size=BLOCK_SIZE, num_blocks=TIGHT_BLOCKS, num_host_blocks=64, policy=policy,
                         token_budget=64, max_chunk_tokens=16, preemption=preemption)
    arrivals = _arrivals(loaded.config.vocab_size)
    trace = run(engine, arrivals)
    assert trace.preemptions
    _check_against_oracle(trace, arrivals, oracle)
    assert_all_blocks_released(engine)
