"""The same greedy tokens whatever the chunking, the policy, the arrival steps and the prefix cache."""

from __future__ import annotations

import pytest

from tests.engine.driver import GREEDY, Arrival, assert_all_blocks_released, make_engine, run, tiny_prompt

MODEL = "llama_gqa_llama3"
LENGTHS_AND_STARTS = ((5, 0), (100, 0), (33, 3), (61, 5), (17, 9))
WHOLE = 4096


def _arrivals(vocab_size: int) -> list[Arrival]:
    return [Arrival(f"r{n}", tiny_prompt(n, vocab_size, seed=n), at=at) for n, at in LENGTHS_AND_STARTS]


@pytest.mark.parametrize(
    ("policy", "token_budget", "max_chunk_tokens"),
    [("chunked", 256, 1), ("chunked", 256, 7), ("chunked", 256, 64), ("chunked", 256, WHOLE),
     ("chunked", 8, 7), ("fcfs", 256, WHOLE), ("decode-first", 64, 16)],
)
def test_output_independent_of_chunking_and_arrival_steps(tiny_loaded, oracle, policy, token_budget, max_chunk_tokens):
    loaded = tiny_loaded[MODEL]
    engine = make_engine(loaded, policy=policy, token_budget=token_budget, max_chunk_tokens=max_chunk_tokens)
    arrivals = _arrivals(loaded.config.vocab_size)
    trace = run(engine, arrivals)
    for arrival in arrivals:
        expected = oracle.greedy(MODEL, arrival.prompt, GREEDY.max_tokens)
        assert trace.tokens(arrival.request_id) == expected, arrival.request_id
    assert not trace.preemptions
    sizes = [n for step_sizes in trace.chunk_sizes for n in step_sizes]
    assert max(sizes) == min(max_chunk_tokens, max(n for n, _ in LENGTHS_AND_STARTS))
    assert max(map(sum, trace.chunk_sizes)) <= token_budget
    prefill_tokens = sum(n for n, _ in LENGTHS_AND_STARTS)
    assert sum(sizes) == prefill_tokens + len(arrivals) * (GREEDY.max_tokens - 1)  # nothing computed twice
    assert_all_blocks_released(engine)


def test_shared_prefix_hits_the_cache_and_keeps_output(tiny_loaded, oracle):
    loaded = tiny_loaded[MODEL]
    prefix = tiny_prompt(40, loaded.config.vocab_size, seed=99)
    suffixes = {name: tiny_prompt(n + 1, loaded.config.vocab_size, seed=n)[1:] for name, n in
                (("first", 9), ("during", 20), ("after", 3))}
    prompts = {name: prefix + suffix for name, suffix in suffixes.items()}
    engine = make_engine(loaded, max_chunk_tokens=16)
    arrivals = [Arrival("first", prompts["first"]), Arrival("during", prompts["during"], at=6)]
    trace = run(engine, arrivals)
    trace_after = run(engine, [Arrival("after", prompts["after"])])
    requests = {**trace.requests, **trace_after.requests}
    assert requests["first"].num_cached_tokens == 0
    assert requests["during"].num_cached_tokens == 40
    assert requests["after"].num_cached_tokens == 40
    tokens = {**trace.streamed, **trace_after.streamed}
    for name, prompt in prompts.items():
        assert tokens[name] == oracle.greedy(MODEL, prompt, GREEDY.max_tokens), name
    assert_all_blocks_released(engine)


def test_repeated_prompt_is_served_from_cache_with_same_output(tiny_loaded, oracle):
    loaded = tiny_loaded[MODEL]
    prompt = tiny_prompt(50, loaded.config.vocab_size, seed=5)
    engine = make_engine(loaded, block_size=4, max_chunk_tokens=8)
    first = run(engine, [Arrival("a", prompt)])
    second = run(engine, [Arrival("b", prompt)])
    assert second.requests["b"].num_cached_tokens == 48  # full blocks before the last prompt token
    assert second.tokens("b") == first.tokens("a") == oracle.greedy(MODEL, prompt, GREEDY.max_tokens)
    assert second.steps < first.steps
