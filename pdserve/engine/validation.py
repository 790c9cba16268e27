"""Request validation shared by the engine and the router: one set of rules, one message each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.engine.errors import InvalidRequestError
from pdserve.requests import SamplingParams
from pdserve.sampling.validate import InvalidSamplingParams, validate_sampling


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
    try:
        validate_sampling(sampling, limits.vocab_size)
    except InvalidSamplingParams as exc:
        raise InvalidRequestError(str(exc)) from exc
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
