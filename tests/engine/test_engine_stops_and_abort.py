"""Ending requests early: stop strings and stop token ids through the LLM text API, eos, and
abort in every state; every block comes back."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdserve.config import PreemptionConfig
from pdserve.engine.llm import LLM
from pdserve.requests import FinishReason, RequestState, SamplingParams
from pdserve.tokenizer import ChatMessage
from tests.engine.conftest import SMOL
from tests.engine.driver import GREEDY, Arrival, Trace, add, assert_all_blocks_released, make_engine, step, tiny_prompt

MODEL = "qwen2_bias"
FRANCE = [ChatMessage("user", "What is the capital of France?")]


def _stream(llm: LLM, prompt, sampling: SamplingParams) -> tuple[str, list[int], list]:
    pieces = list(llm.stream(prompt, sampling))
    tokens = [t for p in pieces for t in p.token_ids]
    assert all(p.finish_reason is None for p in pieces[:-1])
    return "".join(p.text for p in pieces), tokens, pieces[-1].finish_reason


@pytest.fixture()
def tiny_llm(tiny_loaded, tiny_tokenizers) -> LLM:
    engine = make_engine(tiny_loaded[MODEL])
    return LLM(engine.config, tokenizer=tiny_tokenizers[MODEL], engine=engine)


@pytest.mark.timeout(300)
def test_smollm2_eos_and_stop_string(smol_loaded, smol_tokenizer, oracle):
    engine = make_engine(smol_loaded, block_size=16, num_blocks=32)
    llm = LLM(engine.config, tokenizer=smol_tokenizer, engine=engine)
    text, tokens, reason = _stream(llm, FRANCE, SamplingParams(temperature=0.0, max_tokens=24))
    assert (text, reason) == ("The capital of France is Paris.", FinishReason.STOP)
    expected = oracle.greedy(SMOL, llm.encode(FRANCE), 12)  # the parity test asks the same
    assert tokens == expected[: expected.index(smol_tokenizer.eos_token_ids[0]) + 1]
    text, tokens, reason = _stream(llm, FRANCE, SamplingParams(temperature=0.0, max_tokens=24, stop=("Paris",)))
    assert (text, reason) == ("The capital of France is ", FinishReason.STOP)
    assert_all_blocks_released(engine)


def test_stop_string_ends_text_before_it(tiny_llm):
    prompt = tiny_prompt(20, tiny_llm.tokenizer.vocab_size, seed=11)
    full, full_tokens, reason = _stream(tiny_llm, prompt, GREEDY)
    assert reason == FinishReason.LENGTH and len(full_tokens) == GREEDY.max_tokens
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert len(stop) == 3 and stop.strip()
    text, tokens, reason = _stream(tiny_llm, prompt, replace(GREEDY, stop=(stop,)))
    assert (text, reason) == (full[: full.index(stop)], FinishReason.STOP)
    assert tokens == full_tokens[: len(tokens)] and len(tokens) < len(full_tokens)
    assert_all_blocks_released(tiny_llm.engine)


def test_stop_token_id_ends_with_that_token(tiny_llm):
    prompt = tiny_prompt(30, tiny_llm.tokenizer.vocab_size, seed=12)
    _, full_tokens, _ = _stream(tiny_llm, prompt, GREEDY)
    stop_id = full_tokens[6]
    _, tokens, reason = _stream(tiny_llm, prompt, replace(GREEDY, stop_token_ids=(stop_id,)))
    assert reason == FinishReason.STOP
    assert tokens == full_tokens[: full_tokens.index(stop_id) + 1]
    assert_all_blocks_released(tiny_llm.engine)


def test_generate_with_stops_in_a_batch(tiny_llm):
    prompts = [tiny_prompt(n, tiny_llm.tokenizer.vocab_size, seed=n) for n in (9, 40, 25)]
    full = tiny_llm.generate(prompts, GREEDY)
    stop = full[1].text[4:6]
    stopped = tiny_llm.generate(prompts, replace(GREEDY, stop=(stop,)))
    for before, after in zip(full, stopped):
        cut = before.text.find(stop)
        expected = (before.text, FinishReason.LENGTH) if cut < 0 else (before.text[:cut], FinishReason.STOP)
        assert (after.text, after.finish_reason) == expected
    assert stopped[1].finish_reason == FinishReason.STOP
    assert_all_blocks_released(tiny_llm.engine)


def _abort_one_in_each_state(engine, trace: Trace, aborted: dict[RequestState, str]) -> None:
    live = [r for r in trace.requests.values() if not r.is_finished and r.request_id not in aborted.values()]
    for state in (RequestState.SWAPPED, RequestState.WAITING, RequestState.RUNNING):
        victim = next((r for r in live if r.state == state and (r.output_token_ids or state == RequestState.WAITING)),
                      None)
        if state not in aborted and victim is not None:
            assert engine.abort(victim.request_id)
            aborted[state] = victim.request_id
            return


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_abort_in_every_state_frees_every_block(tiny_loaded, oracle, prefix_cache):
    loaded = tiny_loaded[MODEL]
    engine = make_engine(loaded, num_blocks=20, num_host_blocks=64, max_chunk_tokens=16, prefix_cache=prefix_cache,
                         preemption=PreemptionConfig(recompute_below_tokens=0, swap_above_tokens=0))
    arrivals = [Arrival(f"r{n}", tiny_prompt(n, loaded.config.vocab_size, seed=n)) for n in (60, 47, 33, 5, 21, 38)]
    trace, aborted = Trace(), {}
    for arrival in arrivals:
        add(engine, trace, arrival)
    while engine.has_unfinished():
        _abort_one_in_each_state(engine, trace, aborted)
        step(engine, trace)
    assert set(aborted) == {RequestState.SWAPPED, RequestState.WAITING, RequestState.RUNNING}
    for arrival in arrivals:
        rid, request = arrival.request_id, trace.requests[arrival.request_id]
        expected = oracle.greedy(MODEL, arrival.prompt, GREEDY.max_tokens)
        assert trace.finished_outputs[rid] == 1 and trace.tokens(rid) == request.output_token_ids
        if rid in aborted.values():
            assert request.finish_reason == FinishReason.ABORT
            assert request.output_token_ids == expected[: len(request.output_token_ids)]
        else:
            assert (request.finish_reason, request.output_token_ids) == (FinishReason.LENGTH, expected)
    assert not engine.abort(aborted[RequestState.RUNNING]) and not engine.abort("never-added")
    assert_all_blocks_released(engine)
    if not prefix_cache:
        assert engine.scheduler.stats().kv.free == engine.scheduler.stats().kv.total
