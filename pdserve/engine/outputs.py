"""What one engine step reports back to its caller."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.kv.manager import BlockHold
from pdserve.requests import Request, TokenLogprobs
from pdserve.scheduler.output import Preemption, ScheduledChunk
from pdserve.scheduler.results import Reservation


@dataclass(frozen=True)
class RequestOutput:
    """New tokens of one request this step; `finished` on its last output. `logprobs`: one per
    new token, in order, when the request asked for them (else empty)."""

    request: Request
    new_token_ids: tuple[int, ...]
    finished: bool
    logprobs: tuple[TokenLogprobs, ...] = ()
    # With its first token, when its sampling asked prompt_logprobs: one per prompt token but the first.
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass(frozen=True)
class StepResult:
    outputs: tuple[RequestOutput, ...]
    preemptions: tuple[Preemption, ...]
    resumed: tuple[Request, ...]
    chunks: tuple[ScheduledChunk, ...]  # what went through the model (prefill workers stream its KV)
    num_tokens: int  # tokens through the model this step
    seconds: float
    reserved: tuple[Reservation, ...] = ()  # remote requests whose blocks were just allocated
    holds: dict = field(default_factory=dict)  # request_id -> BlockHold taken after this step

    @property
    def is_idle(self) -> bool:
        return not (self.outputs or self.chunks or self.preemptions or self.reserved or self.resumed)


@dataclass(frozen=True)
class Detached:
    """A request that left its engine with its KV (Engine.detach): `hold` covers every token of
    its prompt and output but the last output token, which a new worker feeds first."""

    hold: BlockHold
    output_token_ids: tuple[int, ...]

    @property
    def kv_tokens(self) -> int:
        return self.hold.num_tokens


@dataclass(frozen=True)
class AbortResult:
    found: bool
    holds: tuple = ()  # BlockHolds to give back with Engine.release once no transfer touches them

    def __bool__(self) -> bool:
        return self.found
