"""What the client takes and returns: plain dataclasses, no wire types."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.requests import TokenLogprobs, Usage
from pdserve.tokenizer import ChatMessage as Message  # role (system, user or assistant) and content

__all__ = ["Chunk", "Completion", "Message", "PdserveError", "Timings", "TokenLogprobs", "Usage"]


@dataclass(frozen=True)
class Chunk:
    """One streamed message: tokens and text since the previous one; the last one has
    `finish_reason` ("stop", "length" or "abort") and `usage`."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprobs, ...] = ()
    finish_reason: str | None = None
    usage: Usage | None = None
    index: int = 0  # which sample of the request (n > 1: each ends with its own finish_reason)
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()  # on the first chunk, when the request set prompt_logprobs


@dataclass
class Timings:
    """Seen by the client: time to the first token, and the gaps between later ones."""

    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    total_s: float = 0.0


@dataclass
class Completion:
    request_id: str = ""
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    timings: Timings = field(default_factory=Timings)
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per prompt token but the first


class PdserveError(Exception):
    """The server refused or failed the call: `code` is the gRPC status name
    (INVALID_ARGUMENT, UNAVAILABLE, ...), `details` the server's message, `retry_after_s` when the
    server said when to try again (a RESOURCE_EXHAUSTED refusal by admission, UNAVAILABLE when no
    worker was usable within the router's wait), else None."""

    def __init__(self, code: str, details: str, retry_after_s: float | None = None):
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details
        self.retry_after_s = retry_after_s
