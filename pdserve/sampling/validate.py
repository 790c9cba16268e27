"""Checks on SamplingParams before a request is admitted."""

from __future__ import annotations

import math

from pdserve.requests import SamplingParams
from pdserve.sampling.logprobs import MAX_LOGPROBS


class InvalidSamplingParams(ValueError):
    """A sampling setting is out of range; the message names the field and the allowed range."""


def validate_sampling(params: SamplingParams, vocab_size: int) -> None:
    """Raise InvalidSamplingParams on the first bad field; return None when all are valid."""
    for check in (_max_tokens, _temperature, _top_p, _top_k, _min_p, _stop, _logprobs):
        message = check(params)
        if message is not None:
            raise InvalidSamplingParams(message)
    bad_ids = [i for i in params.stop_token_ids if not 0 <= i < vocab_size]
    if bad_ids:
        raise InvalidSamplingParams(f"stop_token_ids {bad_ids} are outside the vocabulary [0, {vocab_size})")


def _max_tokens(p: SamplingParams) -> str | None:
    if p.max_tokens < 1:
        return f"max_tokens must be at least 1, got {p.max_tokens}"
    return None


def _temperature(p: SamplingParams) -> str | None:
    if not math.isfinite(p.temperature) or p.temperature < 0:
        return f"temperature must be a finite number >= 0 (0 = greedy), got {p.temperature}"
    return None


def _top_p(p: SamplingParams) -> str | None:
    if not 0.0 < p.top_p <= 1.0:
        return f"top_p must be in (0, 1], got {p.top_p}"
    return None


def _top_k(p: SamplingParams) -> str | None:
    if p.top_k < 0:
        return f"top_k must be >= 0 (0 = off), got {p.top_k}"
    return None


def _min_p(p: SamplingParams) -> str | None:
    if not 0.0 <= p.min_p <= 1.0:
        return f"min_p must be in [0, 1], got {p.min_p}"
    return None


def _stop(p: SamplingParams) -> str | None:
    empty = [i for i, s in enumerate(p.stop) if not s]
    if empty:
        return f"stop strings must be non-empty (stop[{empty[0]}] is empty)"
    return None


def _logprobs(p: SamplingParams) -> str | None:
    if p.logprobs is not None and not 0 <= p.logprobs <= MAX_LOGPROBS:
        return f"logprobs must be in [0, {MAX_LOGPROBS}] (unset = none), got {p.logprobs}"
    return None
