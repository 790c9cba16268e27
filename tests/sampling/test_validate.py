from __future__ import annotations

import math

import pytest

from pdserve.requests import SamplingParams
from pdserve.validation import InvalidSamplingParams, validate_sampling

VOCAB = 100


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(max_tokens=1, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0),
        SamplingParams(temperature=2.5, top_p=1e-6, top_k=VOCAB * 10, min_p=1.0, seed=-3),
        SamplingParams(stop=("\n", "User:"), stop_token_ids=(0, VOCAB - 1)),
        SamplingParams(presence_penalty=-2.0, frequency_penalty=2.0, repetition_penalty=10.0, min_tokens=256,
                       logit_bias=((0, -100.0), (VOCAB - 1, 100.0))),
    ],
)
def test_valid(params):
    assert validate_sampling(params, VOCAB) is None


@pytest.mark.parametrize(
    "params, pattern",
    [
        (SamplingParams(max_tokens=0), "max_tokens must be at least 1, got 0"),
        (SamplingParams(max_tokens=-5), "max_tokens"),
        (SamplingParams(temperature=-0.1), "temperature must be a finite number >= 0"),
        (SamplingParams(temperature=math.nan), "temperature"),
        (SamplingParams(temperature=math.inf), "temperature"),
        (SamplingParams(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
        (SamplingParams(top_p=1.01), "top_p"),
        (SamplingParams(top_p=math.nan), "top_p"),
        (SamplingParams(top_k=-1), "top_k must be >= 0"),
        (SamplingParams(min_p=-0.01), r"min_p must be in \[0, 1\]"),
        (SamplingParams(min_p=1.5), "min_p"),
        (SamplingParams(min_p=math.nan), "min_p"),
        (SamplingParams(stop_token_ids=(5, VOCAB)), r"stop_token_ids \[100\] are outside the vocabulary \[0, 100\)"),
        (SamplingParams(stop_token_ids=(-1,)), "outside the vocabulary"),
        (SamplingParams(stop=("ok", "")), r"stop\[1\] is empty"),
        (SamplingParams(presence_penalty=2.5), r"presence_penalty must be in \[-2, 2\]"),
        (SamplingParams(frequency_penalty=math.nan), "frequency_penalty"),
        (SamplingParams(repetition_penalty=0.0), r"repetition_penalty must be in \(0, 10\]"),
        (SamplingParams(repetition_penalty=math.inf), "repetition_penalty"),
        (SamplingParams(max_tokens=4, min_tokens=5), r"min_tokens must be in \[0, max_tokens=4\]"),
        (SamplingParams(min_tokens=-1), "min_tokens"),
        (SamplingParams(logit_bias=((VOCAB, 1.0),)), "logit_bias token id 100 is outside the vocabulary"),
        (SamplingParams(logit_bias=((3, 100.5),)), r"logit_bias for token 3 must be in \[-100, 100\]"),
        (SamplingParams(logit_bias=((3, 1.0), (3, 2.0))), "names a token id twice"),
        (SamplingParams(logit_bias=tuple((i, 1.0) for i in range(301))), "at most 300"),
    ],
)
def test_invalid(params, pattern):
    with pytest.raises(InvalidSamplingParams, match=pattern):
        validate_sampling(params, VOCAB)


def test_is_a_value_error():
    assert issubclass(InvalidSamplingParams, ValueError)
