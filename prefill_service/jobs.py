"""A prefill worker's requests as it keeps them (prefill_service/worker.py drives them): each one's
sends so far, and, while its reservation has not come, the KV its steps computed, held."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pdserve.engine.engine import Engine
from pdserve.kv import BlockHold
from pdserve.requests import Priority, Request, TokenLogprobs
from pdserve.scheduler.held import Held
from pdserve.worker.kv_out import Target
from pdserve.worker.leases import Lease
from pdserve.worker.session import Session


@dataclass
class PrefillJob:
    request_id: str
    kv_tokens: int  # the prompt's, and a resume's tokens so far: the KV this job sends
    target: Target | None  # None: it follows (set_target); until then the steps' KV waits here
    session: Session
    kv_timeout_s: float
    sent_blocks: int = 0  # table entries (layer groups of a block) from the reservation's start
    seq: int = 0
    kv_bytes: int = 0
    kv_descriptors: int = 0
    kv_seconds: float = 0.0
    cached_tokens: int = 0
    queue_seconds: float = 0.0
    resumed: int = 0  # tokens the request had generated before (a resume): the first token sampled here follows them
    failed: bool = False  # ended here: nothing more of it is sent
    request: Request | None = None  # the engine's (LiveRequest): an earlier one's steps never reach this job
    first_logprobs: TokenLogprobs | None = None  # the first token's, once sampled (if the request asked)
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()  # with the first token, if the request asked
    checksums: list[int] = field(default_factory=list)  # each piece's sum as sent, in order (none: unsummed)
    chain: asyncio.Future | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)
    started: bool = False  # a step computed some of it
    waiting: Waiting | None = None  # the KV computed while its target had not come, held
    priority: Priority = Priority.NORMAL
    add: Callable[[Engine], Request] | None = None  # how it enters the engine (again, after a give-back)
    given_back: bool = False  # its held KV went back before its target came: added again at set_target

    def held(self) -> Held | None:
        """What it holds while its KV waits for its target (None: nothing so)."""
        waiting = self.waiting
        if self.target is not None or waiting is None or waiting.hold is None:
            return None
        return Held(self.request_id, self.priority, len(waiting.hold.blocks), waiting.held_at)


@dataclass(frozen=True)
class Computed:
    """What a step computed of a job: its block table then (the hold's), the tokens whose KV it
    holds, and, on the last chunk, the first token."""

    blocks: tuple[int, ...]
    end: int
    final: bool
    first_token: int | None


@dataclass
class Waiting:
    """The latest step's KV of a job without its target, held (each step's hold covers every
    block before it, so only the latest is kept). `lease` gives the hold back unless handed on."""

    computed: Computed
    hold: BlockHold | None
    lease: Lease | None = None
    handed_on: bool = False
    held_at: float = field(default_factory=time.monotonic)
