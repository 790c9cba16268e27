"""Request validation shared by the engine and the router: one set of rules, one message each.
No torch, so the router checks requests without the engine's libraries (a structured-output
constraint is checked by building its grammar, pdserve/grammar, which needs no tokenizer)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.errors import InvalidRequestError
from pdserve.grammar import check_constraint
from pdserve.requests import SamplingParams

MAX_LOGPROBS = 20  # the most top logprobs a request may ask for (OpenAI's limit)
MAX_AGE_S = 86400.0  # the oldest a handed-over request may say it is


class InvalidSamplingParams(InvalidRequestError):
    """A sampling setting is out of range; the message names the field and the allowed range."""


@dataclass(frozen=True)
class Limits:
    vocab_size: int
    max_model_len: int
    kv_capacity_tokens: int | None = None  # one worker's whole KV pool, when known


def validate_request(prompt: Sequence[int], sampling: SamplingParams, limits: Limits, num_output: int = 0) -> None:
    """Raise InvalidRequestError with a clear message; return None for a servable request."""
    if not prompt:
        raise InvalidRequestError("the prompt is empty")
    bad = next((t for t in prompt if not 0 <= t < limits.vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(f"token id {bad} is outside the vocabulary (size {limits.vocab_size})")
    validate_sampling(sampling, limits.vocab_size)
    total = len(prompt) + max(sampling.max_tokens, num_output)
    if total > limits.max_model_len:
        raise InvalidRequestError(
            f"prompt ({len(prompt)} tokens) + max_tokens ({sampling.max_tokens}) = {total} exceeds "
            f"the model's context of {limits.max_model_len} tokens")
    if limits.kv_capacity_tokens is not None and total > limits.kv_capacity_tokens:
        raise InvalidRequestError(
            f"prompt + max_tokens = {total} tokens exceeds a worker's KV pool of {limits.kv_capacity_tokens} tokens")


def validate_resumed(output: Sequence[int], sampling: SamplingParams, limits: Limits) -> None:
    """Tokens a resumed request already generated elsewhere: in the vocabulary, and fewer than
    max_tokens (which counts them), so at least one token is left to generate."""
    bad = next((t for t in output if not 0 <= t < limits.vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(f"output token id {bad} is outside the vocabulary (size {limits.vocab_size})")
    if len(output) >= sampling.max_tokens:
        raise InvalidRequestError(
            f"the request already has {len(output)} output tokens, max_tokens is {sampling.max_tokens}")


def validate_age(age_s: float) -> float:
    """How long a handed-over request had waited before (WorkerRequest.age_s): inside [0, MAX_AGE_S]."""
    if not (math.isfinite(age_s) and 0 <= age_s <= MAX_AGE_S):
        raise InvalidRequestError(f"age_s {age_s} s is outside [0, {MAX_AGE_S:.0f}]")
    return age_s


def validate_sampling(params: SamplingParams, vocab_size: int) -> None:
    """Raise InvalidSamplingParams on the first bad field; return None when all are valid."""
    for check in (_max_tokens, _temperature, _top_p, _top_k, _min_p, _stop, _logprobs, _prompt_logprobs, _penalties,
                  _min_tokens):
        message = check(params)
        if message is not None:
            raise InvalidSamplingParams(message)
    bad_ids = [i for i in params.stop_token_ids if not 0 <= i < vocab_size]
    if bad_ids:
        raise InvalidSamplingParams(f"stop_token_ids {bad_ids} are outside the vocabulary [0, {vocab_size})")
    if (message := _logit_bias(params, vocab_size)) is not None:
        raise InvalidSamplingParams(message)
    if params.constraint is not None:
        if params.ignore_eos:
            raise InvalidSamplingParams("ignore_eos cannot go with a structured-output constraint: the output "
                                        "ends where the constraint is complete")
        check_constraint(params.constraint)


MAX_LOGIT_BIAS = 300  # entries, as OpenAI allows


def _prompt_logprobs(p: SamplingParams) -> str | None:
    if p.prompt_logprobs is not None and not 0 <= p.prompt_logprobs <= MAX_LOGPROBS:
        return f"prompt_logprobs must be in [0, {MAX_LOGPROBS}], got {p.prompt_logprobs}"
    return None


def _penalties(p: SamplingParams) -> str | None:
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(p, name)
        if not (math.isfinite(value) and -2.0 <= value <= 2.0):
            return f"{name} must be in [-2, 2], got {value}"
    if not (math.isfinite(p.repetition_penalty) and 0.0 < p.repetition_penalty <= 10.0):
        return f"repetition_penalty must be in (0, 10] (1 = off), got {p.repetition_penalty}"
    return None


def _min_tokens(p: SamplingParams) -> str | None:
    if not 0 <= p.min_tokens <= p.max_tokens:
        return f"min_tokens must be in [0, max_tokens={p.max_tokens}], got {p.min_tokens}"
    return None


def _logit_bias(p: SamplingParams, vocab_size: int) -> str | None:
    if len(p.logit_bias) > MAX_LOGIT_BIAS:
        return f"logit_bias has {len(p.logit_bias)} entries, at most {MAX_LOGIT_BIAS}"
    ids = [t for t, _ in p.logit_bias]
    if len(set(ids)) != len(ids):
        return "logit_bias names a token id twice"
    for token, bias in p.logit_bias:
        if not 0 <= token < vocab_size:
            return f"logit_bias token id {token} is outside the vocabulary [0, {vocab_size})"
        if not (math.isfinite(bias) and -100.0 <= bias <= 100.0):
            return f"logit_bias for token {token} must be in [-100, 100], got {bias}"
    return None


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
