"""What the router asks of its workers, without wire types: the worker-client interface.

    RequestFlow --WorkerClients.decode(address).open(job, local)-->   DecodeCall: Reservation? Tokens... Finished
               --WorkerClients.decode(leaving).depart(id) / .move_kv(id, reservation)--> a running request's
                                                                   KV moves to another decode worker
               --WorkerClients.decode(address).find(owner) / .attach(job)--> a request another router ran
                                                                   (pdserve/reattach.py): Attached, Tokens...
               --WorkerClients.prefill(address).open(job, reservation)--> PrefillCall: Chunk... FirstToken
               --WorkerClients.prefill(address).open(job, None)--> Chunk --.set_target(id, reservation)--> ... FirstToken
                                                                   (the decode blocks reserved once the prefill started)
               --WorkerClients.stats(address, role)-->                   WorkerSnapshot (the pool's health watch)
    gateway    --WorkerClients.abort(address, role, owner, scope)-->   an Abort of a request another router runs

Two implementations: `router/fleet/grpc_clients.py` (the real workers) and `tests/router/fake_workers.py`
(in-process workers that can be killed, stalled, slowed, partitioned or failed at any step).

A reattachable job's decode call (`WorkerJob.reattachable`) is ended on purpose only with an
Abort of its attempt, which `close()` sends unless the request ended (Finished, Departed): the
worker keeps it for another router only when the call breaks without one (the router died).

Every failure of a call is a `WorkerFault`: what kind it is, and whom it is charged to
(`Culprit`): the worker called, its peer (a prefill stream that failed because the decode
worker it writes into did), or nobody (the client's own deadline). A call is closed with
`close()` on every path; closing ends the request on the worker, which frees what it holds. A
call is read with `next()` (a `Call`) or delivers to a sink as its events arrive (a `PushCall`).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from pdserve.aborts import AbortScope, Owner
from pdserve.identity import WorkerIdentity
from pdserve.reattach import HeldAttempt
from pdserve.requests import Priority, SamplingParams
from pdserve.worker.events import Attached, Chunk, Departed, Finished, FirstToken, Preempted, Tokens


class FaultKind(enum.Enum):
    GONE = "gone"  # the worker died, stalled (keepalive), dropped the connection or is shutting down
    FAILED = "failed"  # the worker reported an internal error while serving this request
    REFUSED = "refused"  # the worker refused the request as given: the request's own fault
    OVERLOADED = "overloaded"  # the worker's queues are full
    TIMEOUT = "timeout"  # a deadline passed (the client's, or the KV transfer's)
    WITHDRAWN = "withdrawn"  # the worker gave the request back (it leaves that role): elsewhere, nobody charged
    INCOMPATIBLE = "incompatible"  # the worker refused KV of another model or layout: another pair, nobody charged
    CORRUPT = "corrupt"  # KV landed other than its sender summed it: the sender is charged, the request goes elsewhere
    ABORTED = "aborted"  # its client aborted it (through another router): it ends, nobody charged
    TAKEN = "taken"  # another router attached the request (its client went there): it goes on there, nobody charged
    LOST = "lost"  # the worker does not hold the request (any more): elsewhere, nobody charged


class Culprit(enum.Enum):
    SELF = "self"  # the worker that was called
    PEER = "peer"  # the decode worker a prefill worker was writing into (CORRUPT: the worker that sent the KV)
    NOBODY = "nobody"


class WorkerFault(Exception):
    """A worker call failed. `address` is the worker called; `culprit` says who caused it."""

    def __init__(self, kind: FaultKind, address: str, message: str, culprit: Culprit = Culprit.SELF):
        super().__init__(message)
        self.kind = kind
        self.address = address
        self.culprit = culprit

    @property
    def message(self) -> str:
        return str(self)


@dataclass(frozen=True)
class WorkerJob:
    """One attempt of a request as the workers see it (its id is unique per attempt)."""

    request_id: str
    prompt: tuple[int, ...]
    sampling: SamplingParams
    priority: Priority
    kv_timeout_s: float
    output_token_ids: tuple[int, ...] = ()
    metadata: tuple[tuple[str, str], ...] = ()
    timeout_s: float | None = None  # what is left of the client's deadline
    age_s: float = 0.0  # since the router accepted the request: workers queue it as that old
    owner: Owner | None = None  # the client's request: an Abort of it through any router reaches this attempt
    reattachable: bool = False  # (decode, with an owner) a broken call leaves it for another router to attach


@dataclass(frozen=True)
class Reservation:
    """Blocks a decode worker reserved for a request's KV; handed unchanged to the prefill worker."""

    transfer_id: str
    transport: str
    kv_address: bytes
    block_ids: tuple[int, ...]
    block_size: int
    block_nbytes: int
    decode_endpoint: str
    secret: bytes = field(repr=False)  # the decode worker's, for this reservation's prefill worker only
    num_blocks: int  # the decode worker's pool
    cached_blocks: int = 0  # leading blocks the decode worker holds already: the prefill worker skips them
    ranks: tuple[tuple[bytes, int, int], ...] = ()  # a tensor-parallel decode worker's (address, head start, head end)
    identity: str = ""  # the decode worker's identity digest: the sender refuses a reservation not its own


DecodeEvent = Reservation | Tokens | Preempted | Finished | Departed | Attached


@dataclass(frozen=True)
class Departure:
    """A decode worker's answer to Depart: whether the request left (then its stream ends with
    Departed after `generated` tokens), or why not (it goes on there)."""

    departed: bool
    generated: int = 0
    reason: str = ""
    kv_kept: bool = False  # its KV waits there for move_kv (else the request is prefilled again)


@dataclass(frozen=True)
class MovedKV:
    kv_bytes: int
    kv_blocks: int
    kv_seconds: float
PrefillEvent = Chunk | FirstToken


@dataclass(frozen=True)
class WorkerSnapshot:
    """A worker's load as its Stats reported it."""

    free_blocks: int
    total_blocks: int
    running: int
    waiting: int
    draining: bool
    active_blocks: int = 0
    queued_prefill_tokens: int = 0  # prompt tokens it still computes (queued or prefilling)
    prefill_tokens_per_s: float = 0.0  # its measured prefill speed (0: unknown)
    step_s: float = 0.0  # its recent steps' seconds (0: none yet)
    role: str = ""  # the role it serves ("": as it was listed)
    next_role: str = ""  # an elastic worker leaving `role` for this one ("": none)
    elastic: bool = False  # its role can change (WorkerClients.set_role)
    identity: WorkerIdentity | None = None  # what it serves (None: it did not say; it is never used)
    target_follows: bool = False  # (prefill) it takes a prefill whose reservation follows (set_target)
    awaiting_target: int = 0  # (prefill) started prompts whose KV waits there for their reservation


class Sink(Protocol):
    """Where a PushCall delivers (router/flow/stream.py's Pumped): its events in order, then its end or
    its fault, once."""

    def deliver(self, event: object) -> None: ...

    def deliver_tokens(self, token_ids: tuple[int, ...]) -> None:
        """A token event of ids alone, as deliver(Tokens(token_ids)) (its object made where needed)."""

    def end(self) -> None: ...

    def fail(self, fault: WorkerFault) -> None: ...

    def worker_leaving(self) -> None:
        """Its worker said it leaves (it drains): not an event of the request; whether it departs
        is asked now rather than at the next poll."""


class PushCall(abc.ABC):
    """One open call whose events are handed to a sink as they arrive (a request on its decode
    worker's event feed: router/fleet/grpc_feed.py) instead of read one by one."""

    @abc.abstractmethod
    def start(self, sink: Sink) -> None:
        """Deliver to `sink` from now on; nothing after `close()`."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the call (idempotent): the worker ends the request and frees what it holds."""


class Call(abc.ABC):
    """One open streaming call. `next()` raises WorkerFault on failure, StopAsyncIteration at the end."""

    @abc.abstractmethod
    async def next(self) -> object:
        """The next event of the stream."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the call (idempotent): the worker ends the request and frees what it holds."""

    def __aiter__(self) -> AsyncIterator:
        return self

    async def __anext__(self):
        return await self.next()


class DecodeClient(abc.ABC):
    address: str

    @abc.abstractmethod
    def open(self, job: WorkerJob, local_prefill: bool) -> Call | PushCall:
        """Start decoding `job`: remote KV (first a Reservation), or prefilled locally."""

    @abc.abstractmethod
    async def match_prefix(self, token_ids: tuple[int, ...], timeout_s: float) -> int | None:
        """Leading tokens whose KV this worker holds (its prefix cache); None when it did not answer."""

    @abc.abstractmethod
    async def depart(self, worker_id: str, keep_kv_s: float | None, timeout_s: float,
                     attachment: int = 0) -> Departure:
        """Stop a decoding request here between two steps, its KV kept for `move_kv` at most
        `keep_kv_s` (None: given back at once). `attachment`: this router's anchor of it (its
        Attached's; 0: its Decode call). Raises WorkerFault."""

    @abc.abstractmethod
    async def move_kv(self, worker_id: str, target: Reservation, timeout_s: float) -> MovedKV:
        """Send a departed request's KV into another decode worker's reservation, completed with
        the request's last token. Raises WorkerFault (culprit PEER: the target failed)."""

    @abc.abstractmethod
    async def find(self, owner: Owner, prompt_digest: bytes, timeout_s: float) -> list[HeldAttempt] | None:
        """The owner's attempts of that prompt this worker holds (pdserve/reattach.py), each with
        its address; None when it did not answer in time."""

    @abc.abstractmethod
    def attach(self, job: WorkerJob) -> Call | PushCall:
        """Drive the attempt `job.request_id` (Find's) of `job.owner` from here on: first Attached
        (its tokens so far), then its events as open()'s; LOST when the worker no longer holds it."""

    @abc.abstractmethod
    async def abort_attempt(self, worker_id: str, attachment: int, timeout_s: float) -> bool | None:
        """End an attempt this router no longer drives (`attachment`: its anchor of it): whether
        it was held; None when the worker did not answer."""

class PrefillClient(abc.ABC):
    address: str

    @abc.abstractmethod
    def open(self, job: WorkerJob, target: Reservation | None) -> Call:
        """Prefill `job` into the decode worker's reservation; ends with FirstToken. `target` None:
        it follows by `set_target` (once the worker sent its first Chunk: started, the KV it
        computes waits there for it); no FirstToken comes before it."""

    @abc.abstractmethod
    async def set_target(self, worker_id: str, target: Reservation, timeout_s: float) -> None:
        """The reservation of a prefill opened without one. Raises WorkerFault (LOST: the worker
        no longer runs it; REFUSED: a reservation it cannot fill, and the prefill fails with it)."""

    @abc.abstractmethod
    async def match_prefix(self, token_ids: tuple[int, ...], timeout_s: float) -> int | None:
        """Leading tokens this worker has cached; None when it did not answer."""


class WorkerClients(abc.ABC):
    """Clients by address, and the health watch's Stats call."""

    @abc.abstractmethod
    def decode(self, address: str) -> DecodeClient: ...

    @abc.abstractmethod
    def prefill(self, address: str) -> PrefillClient: ...

    @abc.abstractmethod
    async def stats(self, address: str, role: str, timeout_s: float) -> WorkerSnapshot:
        """Raises WorkerFault when the worker does not answer in time."""

    @abc.abstractmethod
    async def set_role(self, address: str, role: str, timeout_s: float) -> tuple[str, str]:
        """Ask an elastic worker to serve `role` (WorkerControl.SetRole): (its role now, the one
        it changes to, "" if none). Raises WorkerFault."""

    @abc.abstractmethod
    async def abort(self, address: str, role: str, owner: Owner, scope: AbortScope, timeout_s: float) -> bool | None:
        """Abort the owner's requests the worker holds (pdserve/worker/client_aborts.py): whether it
        held one; None when it did not answer in time."""

    @abc.abstractmethod
    async def forget(self, address: str) -> None:
        """The worker left the pool: drop its connection."""

