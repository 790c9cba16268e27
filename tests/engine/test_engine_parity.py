"""Greedy decoding through the whole Engine (scheduler, KV manager, batching, sampler) equals
transformers' generate(do_sample=False), token for token, with several requests in flight."""

from __future__ import annotations

import pytest

from pdserve.requests import SamplingParams
from pdserve.tokenizer import ChatMessage
from tests.engine.conftest import SMOL, TINY_NAMES
from tests.engine.driver import Arrival, assert_all_blocks_released, make_engine, run, tiny_prompt

SMOL_NEW_TOKENS = 12
TINY_NEW_TOKENS = 16
TINY_LENGTHS = (5, 33, 100)
SMOL_QUESTIONS = (
    "Hi!",
    "What is the capital of France?",
    "Summarise in one sentence why chunked prefill keeps decoding latency low when a very long prompt "
    "arrives while other users are streaming answers, and name one cost it adds to the scheduler.",
)


@pytest.mark.timeout(420)
def test_smollm2_batched_greedy_matches_transformers(smol_loaded, smol_tokenizer, oracle):
    prompts = [smol_tokenizer.apply_chat_template([ChatMessage("user", q)]) for q in SMOL_QUESTIONS]
    assert len(prompts[0]) < len(prompts[1]) < len(prompts[2])
    sampling = SamplingParams(temperature=0.0, max_tokens=SMOL_NEW_TOKENS, ignore_eos=True)
    engine = make_engine(smol_loaded, block_size=16, num_blocks=48, max_chunk_tokens=32)
    arrivals = [Arrival(f"q{i}", p, sampling, at=2 * i) for i, p in enumerate(prompts)]
    trace = run(engine, arrivals)
    for i, prompt in enumerate(prompts):
        assert trace.tokens(f"q{i}") == oracle.greedy(SMOL, prompt, SMOL_NEW_TOKENS), SMOL_QUESTIONS[i]
    assert_all_blocks_released(engine)


@pytest.mark.parametrize("name", TINY_NAMES)
def test_tiny_models_batched_greedy_match_transformers(tiny_loaded, oracle, name):
    loaded = tiny_loaded[name]
    prompts = [tiny_prompt(n, loaded.config.vocab_size, seed=n) for n in TINY_LENGTHS]
    sampling = SamplingParams(temperature=0.0, max_tokens=TINY_NEW_TOKENS, ignore_eos=True)
    engine = make_engine(loaded, max_chunk_tokens=48)
    trace = run(engine, [Arrival(f"r{n}", p, sampling, at=i) for i, (n, p) in enumerate(zip(TINY_LENGTHS, prompts))])
    for n, prompt in zip(TINY_LENGTHS, prompts):
        assert trace.tokens(f"r{n}") == oracle.greedy(name, prompt, TINY_NEW_TOKENS), f"{name}, prompt of {n}"
        assert trace.requests[f"r{n}"].finish_reason.value == "length"
    assert_all_blocks_released(engine)
