"""Boundaries: prompts around block edges served again from the prefix cache, one-token
requests, and requests resumed with tokens produced elsewhere."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdserve.errors import InvalidRequestError
from tests.engine.driver import (GREEDY, SEEDED, Arrival, Trace, assert_all_blocks_released, make_engine, run, step,
                                 tiny_prompt)

MODEL = "mistral"
BLOCK_SIZE = 4


@pytest.mark.parametrize("length", [1, 2, 4, 5, 8, 9, 17])
def test_block_edges_fresh_and_cached(tiny_loaded, oracle, length):
    """The second run matches every full block before the last prompt token."""
    loaded = tiny_loaded[MODEL]
    prompt = tiny_prompt(length, loaded.config.vocab_size, seed=length)
    engine = make_engine(loaded, block_size=BLOCK_SIZE, max_chunk_tokens=8)
    expected = oracle.greedy(MODEL, prompt, GREEDY.max_tokens)
    first = run(engine, [Arrival("first", prompt)])
    again = run(engine, [Arrival("again", prompt), Arrival("one", prompt, replace(GREEDY, max_tokens=1))])
    assert first.tokens("first") == again.tokens("again") == expected
    assert again.tokens("one") == expected[:1] and again.requests["one"].finish_reason.value == "length"
    assert again.requests["again"].num_cached_tokens == (length - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert_all_blocks_released(engine)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_resumed_request_continues_where_it_left_off(tiny_loaded, sampling):
    """add_request(output_token_ids=...) re-prefills the tokens produced so far and goes on as
    if it had never stopped; only the new tokens are streamed."""
    loaded = tiny_loaded[MODEL]
    prompt = tiny_prompt(30, loaded.config.vocab_size, seed=3)
    engine = make_engine(loaded, block_size=BLOCK_SIZE, max_chunk_tokens=8, prefix_cache=False)
    whole = run(engine, [Arrival("whole", prompt, sampling)]).tokens("whole")
    trace = Trace()
    request = engine.add_request("resumed", prompt, sampling, output_token_ids=whole[:7])
    trace.requests["resumed"], trace.streamed["resumed"] = request, []
    while engine.has_unfinished():
        step(engine, trace)
    assert request.output_token_ids == whole
    assert trace.tokens("resumed") == whole[7:]
    assert_all_blocks_released(engine)


@pytest.mark.parametrize(("output", "message"), [([5] * 16, "already has 16 output tokens, max_tokens is 16"),
                                                 ([5, 384], "output token id 384 is outside the vocabulary"),
                                                 ([-2], "output token id -2 is outside the vocabulary")])
def test_resumed_request_with_impossible_output_is_refused(tiny_loaded, output, message):
    """Before this was checked, an out-of-vocabulary output id crashed the next step (an index
    error inside the model, for every request in the batch) and a full output got one more token."""
    loaded = tiny_loaded[MODEL]
    engine = make_engine(loaded, block_size=BLOCK_SIZE)
    prompt = tiny_prompt(10, loaded.config.vocab_size, seed=4)
    with pytest.raises(InvalidRequestError, match=message):
        engine.add_request("resumed", prompt, GREEDY, output_token_ids=output)
    assert engine.scheduler.get("resumed") is None
    assert len(run(engine, [Arrival("next", prompt)]).tokens("next")) == GREEDY.max_tokens
