"""The events of one request on a worker, one vocabulary on both sides of the wire: a worker
streams them, its servicer turns them into wire messages (prefill_service/servicer.py,
decode_service/servicer.py), and the router's gRPC clients turn those back into the same types
(router/fleet/grpc_clients.py) for the flow (router/flow/flow.py).

    decode:   Reserved (the router sees it as a Reservation, with where to send), Tokens ...,
              Preempted (preempted, swapped in, resumed), Finished or Departed; an Attach call's
              first: Attached
    prefill:  Chunk ..., FirstToken
    either:   Failed (on the worker only: its stream ends with the error's status)
"""

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
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()  # with the first token of a prompt prefilled here, if asked


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    cached_tokens: int
    preemptions: int
    queue_seconds: float = 0.0  # the worker's own figure (its metrics); not on the wire


@dataclass(frozen=True)
class Departed:
    """The request left this decode worker (Depart) after `generated` tokens, all streamed
    before this event; `kv_kept`: its KV waits there for MoveKV. Ends the stream."""

    generated: int
    kv_kept: bool = False


@dataclass(frozen=True)
class Preempted:
    """A preemption-related event of the request."""

    mode: str  # "recompute" | "swap" (empty for a resume notice)
    reason: str
    phase: str  # "preempted" | "swapped_in" | "resumed"


@dataclass(frozen=True)
class Chunk:
    """One prefill chunk of the prompt computed."""

    start: int
    num_tokens: int
    cached_tokens: int
    step_seconds: float


@dataclass(frozen=True)
class FirstToken:
    """The prompt's KV is in the decode worker's blocks and the first token is sampled."""

    token_id: int
    cached_tokens: int
    kv_bytes: int = 0
    kv_blocks: int = 0
    kv_descriptors: int = 0
    kv_seconds: float = 0.0
    queue_seconds: float = 0.0
    logprobs: TokenLogprobs | None = None  # the first token's, when the request asked
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()  # one per prompt token but the first, when asked


@dataclass(frozen=True)
class Attached:
    """(A decode call's first event, by Attach: pdserve/reattach.py.) The request's tokens so far;
    `attachment` numbers the call among the request's anchors (its Decode call 0)."""

    token_ids: tuple[int, ...]
    attachment: int


@dataclass(frozen=True)
class Failed:
    """The request cannot go on here (a transfer failed, a deadline passed)."""

    error: Exception


Event = Reserved | Tokens | Finished | Departed | Preempted | Chunk | FirstToken | Attached | Failed
