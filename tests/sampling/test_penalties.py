"""The logits a request's biases, penalties and min_tokens leave, against the definitions (OpenAI's
presence and frequency penalties and logit_bias, vLLM's repetition penalty and min_tokens); the
raw logits are never written (log-probabilities are read from them)."""

from __future__ import annotations

import torch

from pdserve.requests import Request, SamplingParams
from pdserve.sampling.penalties import adjust_logits

V = 8


def _request(prompt=(1, 2), output=(), eos=(7,), **sampling) -> Request:
    return Request("r", list(prompt), SamplingParams(**sampling), output_token_ids=list(output), eos_token_ids=eos)


def test_nothing_asked_returns_the_logits_themselves():
    logits = torch.randn(2, V)
    assert adjust_logits(logits, [_request(), _request(temperature=0.0)]) is logits


def test_presence_and_frequency_penalties_follow_the_output_counts():
    logits = torch.zeros(1, V)
    out = adjust_logits(logits, [_request(output=(3, 3, 5), presence_penalty=0.5, frequency_penalty=0.25)])
    want = torch.zeros(V)
    want[3] = -(0.5 + 2 * 0.25)
    want[5] = -(0.5 + 0.25)
    assert torch.equal(out[0], want) and torch.equal(logits, torch.zeros(1, V))


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = torch.tensor([[2.0, -2.0, 4.0, -4.0, 1.0, 1.0, 1.0, 1.0]])
    out = adjust_logits(logits, [_request(prompt=(0, 1), output=(2, 3), repetition_penalty=2.0)])
    assert out[0].tolist() == [1.0, -4.0, 2.0, -8.0, 1.0, 1.0, 1.0, 1.0]


def test_logit_bias_adds_and_min_tokens_bans_every_end_until_reached():
    logits = torch.zeros(2, V)
    early = _request(output=(4,), logit_bias=((2, 5.0), (6, -3.0)), min_tokens=2, stop_token_ids=(5,))
    done = _request(output=(4, 4), min_tokens=2, stop_token_ids=(5,))
    out = adjust_logits(logits, [early, done])
    assert out[0].tolist() == [0.0, 0.0, 5.0, 0.0, 0.0, float("-inf"), -3.0, float("-inf")]
    assert out[1].tolist() == [0.0] * V  # two tokens out: ends allowed again
