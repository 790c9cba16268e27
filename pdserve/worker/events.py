"""Events a worker streams for one request (turned into wire messages by the servicers)."""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.requests import FinishReason, TokenLogprobs


@dataclass(frozen=True)
class Reserved:
    transfer_id: str
    block_ids: tuple[int, ...]
    secret: bytes  # drawn for this reservation: whoever fills it must present it
    cached_blocks: int = 0  # leading blocks the decode worker holds already: never sent


@dataclass(frozen=True)
class Tokens:
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprobs, ...] = ()  # one per token id when the request asked, else empty


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    cached_tokens: int
    preemptions: int
    queue_seconds: float


@dataclass(frozen=True)
class Notice:
    """A preemption-related event of the request: phase preempted | swapped_in | resumed."""

    mode: str
    reason: str
    phase: str


@dataclass(frozen=True)
class ChunkDone:
    start: int
    num_tokens: int
    cached_tokens: int
    step_seconds: float


@dataclass(frozen=True)
class PrefillDone:
    first_token_id: int
    cached_tokens: int
    kv_bytes: int
    kv_blocks: int
    kv_descriptors: int
    kv_seconds: float
    queue_seconds: float
    first_logprobs: TokenLogprobs | None = None  # when the request asked for logprobs


@dataclass(frozen=True)
class Failed:
    """The request cannot go on here (a transfer failed, a deadline passed)."""

    error: Exception


Event = Reserved | Tokens | Finished | Notice | ChunkDone | PrefillDone | Failed
