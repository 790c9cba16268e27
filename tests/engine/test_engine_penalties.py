"""Biases, penalties and min_tokens through the whole Engine, greedy: a +100 bias makes its token
every token, a -100 bias on the token greedy chose makes another one first, min_tokens holds an
end of sequence the bias forces back until that many tokens are out, and a request that asks
nothing equals one that asks for the neutral values. The logprobs a request asks for stay the
model's own (the same with and without a bias)."""

from __future__ import annotations

import dataclasses

import pytest

from pdserve.engine.engine import Engine
from pdserve.requests import FinishReason, SamplingParams
from tests.engine.driver import GREEDY, make_engine, tiny_prompt

MODEL = "llama_gqa_llama3"
PROMPT_SEED = 11


def _run(engine: Engine, request_id: str, prompt: list[int], sampling: SamplingParams):
    engine.add_request(request_id, prompt, sampling)
    tokens, logprobs, reason = [], [], None
    while engine.has_unfinished():
        for out in engine.step().outputs:
            if out.request_id == request_id:
                tokens.extend(out.new_token_ids)
                logprobs.extend(out.logprobs)
                if out.finished:
                    reason = out.request.finish_reason
    return tokens, logprobs, reason


@pytest.fixture()
def engine(tiny_loaded):
    return make_engine(tiny_loaded[MODEL])


def test_biases_steer_greedy_tokens_and_logprobs_stay_the_models(engine):
    prompt = tiny_prompt(12, engine.limits.vocab_size, PROMPT_SEED)
    plain, plain_lp, _ = _run(engine, "plain", prompt, dataclasses.replace(GREEDY, logprobs=0))
    neutral, _, _ = _run(engine, "neutral", prompt, dataclasses.replace(
        GREEDY, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, logit_bias=(), min_tokens=0))
    forced, _, _ = _run(engine, "forced", prompt, dataclasses.replace(GREEDY, logit_bias=((42, 100.0),)))
    other, other_lp, _ = _run(engine, "other", prompt, dataclasses.replace(
        GREEDY, logprobs=0, logit_bias=((plain[0], -100.0),)))
    assert neutral == plain
    assert forced == [42] * GREEDY.max_tokens
    assert other[0] != plain[0]
    # the model's own logprob of the token it picked: the bias changed the choice, not the numbers
    assert other_lp[0].top == () and other_lp[0].token_id == other[0] and plain_lp[0].token_id == plain[0]


def test_min_tokens_holds_back_an_end_of_sequence(engine):
    prompt = tiny_prompt(12, engine.limits.vocab_size, PROMPT_SEED)
    eos = engine.eos_token_ids[0]
    ends_at_once = SamplingParams(temperature=0.0, max_tokens=16, logit_bias=((eos, 100.0),))
    tokens, _, reason = _run(engine, "at-once", prompt, ends_at_once)
    assert (tokens, reason) == ([eos], FinishReason.STOP)
    tokens, _, reason = _run(engine, "held", prompt, dataclasses.replace(ends_at_once, min_tokens=5))
    assert len(tokens) == 6 and eos not in tokens[:5] and tokens[5] == eos and reason == FinishReason.STOP
