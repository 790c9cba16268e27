"""In-process workers behind the worker-client interface, for tests of the request protocol.

A `FakeFleet` (tests/router/fake_fleet.py) plays prefill and decode workers on one asyncio loop, with the semantics of the
real ones: a decode worker reserves blocks, a prefill worker holds its blocks while it computes
and writes chunk by chunk into the reservation, then sends the first token; closing a call ends
the request on the worker, which frees its blocks; an Abort by owner ends the owner's requests
there or leaves a tombstone. Tokens are a function of the prompt and the
position only, so a request resumed elsewhere continues exactly.

Faults (`Trigger`), at any point a request passes on a worker:
    KILL       the worker dies: every call on it fails GONE at once, its memory is gone
    STALL      it stops for `seconds`: callers see GONE after the keepalive time; the worker
               notices that its calls were closed only when it runs again, and frees then
    SLOW       every step takes `factor` times longer from now on
    PARTITION  the prefill worker can no longer reach the decode worker of this request
    FAIL       an internal error fails this one request on the worker (FAILED)
    CALL       `then_call()` runs there (a test's own fault elsewhere: a router's death)
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pdserve.aborts import AbortScope, Owner, RecentIds
from pdserve.identity import WorkerIdentity
from pdserve.requests import TokenLogprobs
from router.fleet.clients import Call, Culprit, FaultKind, WorkerFault, WorkerSnapshot

DECODE_POINTS = ("open", "reserved", "received", "token", "last")  # last: every token out, Finished not yet
MOVE_POINTS = ("departed", "move")  # decode: it left with its KV (Depart); MoveKV of that KV begins
PREFILL_POINTS = ("open", "chunk", "written")
HELD_POINT = "held"  # prefill: every step its KV waits for a reservation that follows (set_target)


def token_at(prompt: tuple[int, ...], index: int) -> int:
    """The token a fake worker generates at output position `index` of `prompt`."""
    return (sum(prompt) * 7919 + index * 31) % 1000 + 1


def logprobs_at(prompt: tuple[int, ...], index: int, k: int | None) -> tuple[TokenLogprobs, ...]:
    """What a fake worker reports for token_at(prompt, index) with sampling.logprobs = k: a
    function of the position only (so a resumed request continues exactly); () when k is None."""
    if k is None:
        return ()
    token, logprob = token_at(prompt, index), -0.001 * (index + 1)
    return (TokenLogprobs(token, logprob, tuple((token + j, logprob - j) for j in range(k))),)


class Mode(enum.Enum):
    KILL = "kill"
    STALL = "stall"
    SLOW = "slow"
    PARTITION = "partition"
    FAIL = "fail"
    CALL = "call"


@dataclass
class Trigger:
    address: str
    point: str  # one of DECODE_POINTS / PREFILL_POINTS
    mode: Mode
    seconds: float = 0.5  # STALL
    factor: float = 4.0  # SLOW
    then: Trigger | None = None  # armed the moment this one fires (a second fault where the first leads)
    fired: bool = False
    then_call: Callable[[], None] | None = None  # CALL


class _Killed(Exception):
    pass


@dataclass
class FakeSession:
    """A request on a fake worker: its blocks, and the events it produced for the caller."""

    worker_id: str
    blocks: int
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    closed: bool = False  # the caller closed the call (the worker may not have noticed yet)
    epoch: int = 0  # the worker's life it belongs to (a restart starts a new one)
    received: asyncio.Future | None = None  # decode: the first token, once all KV arrived
    written: int = 0  # decode: blocks written by the prefill worker
    departing: asyncio.Future | None = None  # decode: Depart asked; resolved with the tokens generated then
    keep_kv_s: float | None = None  # ... and how long its KV waits for MoveKV (None: given back)
    owner: Owner | None = None  # the client's request (an Abort through any router ends it)
    prompt: tuple[int, ...] = ()  # decode: its prompt, and every token it generated (resumed ones first)
    tokens: list[int] = field(default_factory=list)
    reattachable: bool = False  # decode: a call of a cut router orphans it (RouterLink), another may attach it
    local: bool = False  # decode: it prefills itself
    orphaned: bool = False  # its router was cut while it decoded: it goes on, for another router to attach
    attachment: int = 0  # its anchor now: each attach the next
    target: asyncio.Future | None = None  # prefill opened without its reservation: it comes by set_target

    @property
    def attachable(self) -> bool:
        return self.reattachable and (self.local or (self.received is not None and self.received.done()
                                                     and not self.received.cancelled()))


@dataclass
class HeldKV:
    """A departed request's KV on a fake decode worker, until MoveKV or its keep time."""

    blocks: int
    last_token: int


@dataclass(frozen=True)
class FleetConfig:
    block_size: int = 4
    blocks: int = 256
    chunk_tokens: int = 16
    step_s: float = 0.002
    keepalive_s: float = 0.2  # how long a caller waits on a silent, stalled worker


class Fleet(Protocol):
    """What a worker asks of its fleet (fake_fleet.py's FakeFleet): the settings, and the faults
    armed for a point a request passes."""

    config: FleetConfig

    def fire(self, worker: FakeWorker, session: FakeSession, point: str) -> None: ...


class FakeWorker:
    def __init__(self, fleet: Fleet, address: str, role: str):
        self.fleet = fleet
        self.address = address
        self.role = role
        self.killed = False
        self.slow = 1.0
        self.running = asyncio.Event()
        self.running.set()
        self.sessions: dict[str, FakeSession] = {}
        self.transfers: dict[str, FakeSession] = {}  # decode: transfer id -> the reservation's session
        self.free = fleet.config.blocks
        self.epoch = 0
        self._ids = itertools.count()
        self.cached: dict[tuple[int, ...], int] = {}  # a test's prefix-cache contents: prefix -> tokens held
        # what its Stats report of its speed and queue (set by a test; 0: not known)
        self.queued_prefill_tokens, self.prefill_tokens_per_s, self.step_s = 0, 0.0, 0.0
        self.waiting = 0  # requests its Stats say are queued there (set by a test)
        self.elastic, self.next_role = False, ""  # an elastic worker's role changes (FakeFleet.set_role)
        self.draining = False  # set by a test: its Stats say it drains
        self.held: dict[str, HeldKV] = {}  # decode: departed requests' KV, by their id here
        self.identity: WorkerIdentity | None = None  # what its Stats say it serves (set by a test)
        self.opened = 0  # requests it was given, ever
        self.skew = 0  # added to every token it generates (set by a test: a worker that computes wrong)
        self.reserving = asyncio.Event()  # cleared by a test: its reservations (decode) or prefills wait, queued
        self.reserving.set()
        self.tombstones = RecentIds()  # owners aborted before a request of theirs came (as ClientAborts)
        self.abort_answer_s = 0.0  # how long its answer to an Abort by owner takes (set by a test: a loaded worker)

    def cached_prefix(self, token_ids: tuple[int, ...]) -> int | None:
        """What MatchPrefix answers: the longest cached prefix set by a test; None while down."""
        if self.killed or self.stalled:
            return None
        return max((n for prefix, n in self.cached.items() if tuple(token_ids[:len(prefix)]) == prefix), default=0)

    @property
    def active_blocks(self) -> int:
        return 0 if self.killed else self.fleet.config.blocks - self.free

    def kill(self) -> None:
        self.killed, self.epoch = True, self.epoch + 1
        for session in self.sessions.values():
            session.events.put_nowait(WorkerFault(FaultKind.GONE, self.address, f"{self.address} was killed"))
            if session.received is not None and not session.received.done():
                session.received.cancel()
        self.sessions.clear()
        self.transfers.clear()
        self.held.clear()
        self.free = self.fleet.config.blocks
        self.running.set()

    def restart(self) -> None:
        self.killed, self.slow = False, 1.0
        self.running.set()

    def stall(self, seconds: float) -> None:
        self.running.clear()
        asyncio.get_running_loop().call_later(seconds, self.running.set)

    @property
    def stalled(self) -> bool:
        return not self.running.is_set()

    async def step(self, session: FakeSession, point: str | None = None, seconds: float | None = None) -> None:
        """One unit of work; raises _Killed, or ends the session if its caller closed it."""
        await asyncio.sleep((self.fleet.config.step_s if seconds is None else seconds) * self.slow)
        if point is not None:
            self.fleet.fire(self, session, point)
        await self.running.wait()
        if self.killed or session.epoch != self.epoch:
            raise _Killed
        if session.closed:
            raise asyncio.CancelledError

    def open_session(self, worker_id: str, blocks: int, owner: Owner | None = None) -> FakeSession:
        if self.killed:
            raise WorkerFault(FaultKind.GONE, self.address, f"{self.address}: connection refused")
        if owner is not None and self.tombstones.take(*owner):
            raise WorkerFault(FaultKind.ABORTED, self.address, f"{self.address}: aborted before it came", Culprit.NOBODY)
        if blocks > self.free:
            raise WorkerFault(FaultKind.OVERLOADED, self.address, f"{self.address}: out of KV blocks")
        self.free -= blocks
        self.opened += 1
        session = FakeSession(worker_id, blocks, epoch=self.epoch, owner=owner)
        self.sessions[worker_id] = session
        return session

    def abort(self, owner: Owner, scope: AbortScope) -> bool:
        """As pdserve/worker/client_aborts.py: the owner's sessions end ABORTED (their blocks come
        back when they next run), or a tombstone; FORGET drops one."""
        if scope is AbortScope.FORGET:
            self.tombstones.take(*owner)
            return False
        held = [s for s in self.sessions.values() if s.owner == owner and not s.closed]
        for session in held:
            session.events.put_nowait(WorkerFault(FaultKind.ABORTED, self.address, "aborted by its client",
                                                  Culprit.NOBODY))
            _close(session)
        if not held and scope is AbortScope.REMEMBER:
            self.tombstones.add(*owner)
        return bool(held)

    def hold(self, worker_id: str, session: FakeSession, last_token: int) -> None:
        """The session's blocks stay taken for a move (at most its keep time), not freed at its end."""
        held = self.held[worker_id] = HeldKV(session.blocks, last_token)
        session.blocks = 0
        epoch = self.epoch

        def expire() -> None:
            if epoch == self.epoch and self.held.get(worker_id) is held:
                self.release(worker_id)

        asyncio.get_running_loop().call_later(session.keep_kv_s, expire)

    def release(self, worker_id: str) -> HeldKV | None:
        held = self.held.pop(worker_id, None)
        if held is not None:
            self.free += held.blocks
        return held

    def end_session(self, session: FakeSession) -> None:
        if session.epoch == self.epoch and self.sessions.pop(session.worker_id, None) is not None:
            self.free += session.blocks
            self.transfers = {t: s for t, s in self.transfers.items() if s is not session}

    def run(self, session: FakeSession, body) -> None:
        """Run the worker side of a call; whatever ends it, its blocks come back."""

        async def serve() -> None:
            try:
                async for event in body:
                    session.events.put_nowait(event)
                session.events.put_nowait(StopAsyncIteration())
            except (_Killed, asyncio.CancelledError):
                pass  # killed: its caller already saw GONE; closed: nobody reads any more
            except WorkerFault as fault:
                session.events.put_nowait(fault)
            finally:
                self.end_session(session)

        asyncio.ensure_future(serve())

    def settle_role(self) -> None:
        """A change of role under way happens once it serves nothing."""
        if self.next_role and not self.sessions:
            self.role, self.next_role = self.next_role, ""

    def snapshot(self) -> WorkerSnapshot:
        self.settle_role()
        return WorkerSnapshot(self.free, self.fleet.config.blocks, len(self.sessions), self.waiting, self.draining,
                              self.active_blocks,
                              self.queued_prefill_tokens, self.prefill_tokens_per_s, self.step_s, self.role,
                              self.next_role, self.elastic, self.identity, target_follows=True,
                              awaiting_target=sum(1 for s in self.sessions.values()
                                                  if s.target is not None and not s.target.done()))


class Link(Protocol):
    """A router's connection to the workers (fake_fleet.py's RouterLink): cut, its calls end
    without closing their requests, as a router's death leaves them."""

    cut: bool


class FakeCall(Call):
    """The caller's side of one call: a worker that is killed fails it at once, a stalled one
    after the keepalive time; `close` tells the worker, which frees when it next runs (an
    attachable decode request of a cut link is orphaned instead)."""

    def __init__(self, worker: FakeWorker, session: FakeSession | None, refused: WorkerFault | None = None,
                 link: Link | None = None):
        self.worker = worker
        self.session = session
        self.refused = refused
        self.link = link
        self._queue = session.events if session is not None else None
        self._attachment = session.attachment if session is not None else 0
        self._done = False

    async def next(self) -> object:
        if self.refused is not None:
            raise self.refused
        if self._done:
            raise StopAsyncIteration
        while True:
            try:
                item = await asyncio.wait_for(self._queue.get(), self.worker.fleet.config.keepalive_s)
            except asyncio.TimeoutError:
                if self.worker.stalled:
                    self.close()
                    raise WorkerFault(FaultKind.GONE, self.worker.address, f"{self.worker.address}: keepalive "
                                                                           "timed out") from None
                continue
            if isinstance(item, BaseException):
                self._done = True
                raise item
            return item

    def close(self) -> None:
        session = self.session
        if session is None or session.attachment != self._attachment:  # another router's since
            return
        if self.link is not None and self.link.cut and session.attachable:
            session.orphaned = True
            return
        _close(session)


def _close(session: FakeSession) -> None:
    """The worker ends it when it next runs (a decode session waiting for its KV at once)."""
    session.closed = True
    if session.received is not None and not session.received.done():
        session.received.cancel()
