"""In-process workers behind the worker-client interface, for tests of the request protocol.

A `FakeFleet` plays prefill and decode workers on one asyncio loop, with the semantics of the
real ones: a decode worker reserves blocks, a prefill worker holds its blocks while it computes
and writes chunk by chunk into the reservation, then sends the first token; closing a call ends
the request on the worker, which frees its blocks. Tokens are a function of the prompt and the
position only, so a request resumed elsewhere continues exactly.

Faults (`Trigger`), at any point a request passes on a worker:
    KILL       the worker dies: every call on it fails GONE at once, its memory is gone
    STALL      it stops for `seconds`: callers see GONE after the keepalive time; the worker
               notices that its calls were closed only when it runs again, and frees then
    SLOW       every step takes `factor` times longer from now on
    PARTITION  the prefill worker can no longer reach the decode worker of this request
    FAIL       an internal error fails this one request on the worker (FAILED)
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from dataclasses import dataclass, field

from pdserve.requests import FinishReason
from router.clients import (
    Call,
    Chunk,
    Culprit,
    DecodeClient,
    FaultKind,
    Finished,
    FirstToken,
    PrefillClient,
    Reservation,
    Tokens,
    WorkerClients,
    WorkerFault,
    WorkerJob,
    WorkerSnapshot,
)

DECODE_POINTS = ("open", "reserved", "received", "token", "last")  # last: every token out, Finished not yet
PREFILL_POINTS = ("open", "chunk", "written")


def token_at(prompt: tuple[int, ...], index: int) -> int:
    """The token a fake worker generates at output position `index` of `prompt`."""
    return (sum(prompt) * 7919 + index * 31) % 1000 + 1


class Mode(enum.Enum):
    KILL = "kill"
    STALL = "stall"
    SLOW = "slow"
    PARTITION = "partition"
    FAIL = "fail"


@dataclass
class Trigger:
    address: str
    point: str  # one of DECODE_POINTS / PREFILL_POINTS
    mode: Mode
    seconds: float = 0.5  # STALL
    factor: float = 4.0  # SLOW
    fired: bool = False


class _Killed(Exception):
    pass


@dataclass
class _Session:
    """A request on a fake worker: its blocks, and the events it produced for the caller."""

    worker_id: str
    blocks: int
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    closed: bool = False  # the caller closed the call (the worker may not have noticed yet)
    epoch: int = 0  # the worker's life it belongs to (a restart starts a new one)
    received: asyncio.Future | None = None  # decode: the first token, once all KV arrived
    written: int = 0  # decode: blocks written by the prefill worker


@dataclass(frozen=True)
class FleetConfig:
    block_size: int = 4
    blocks: int = 256
    chunk_tokens: int = 16
    step_s: float = 0.002
    keepalive_s: float = 0.2  # how long a caller waits on a silent, stalled worker


class FakeWorker:
    def __init__(self, fleet: FakeFleet, address: str, role: str):
        self.fleet = fleet
        self.address = address
        self.role = role
        self.killed = False
        self.slow = 1.0
        self.running = asyncio.Event()
        self.running.set()
        self.sessions: dict[str, _Session] = {}
        self.transfers: dict[str, _Session] = {}  # decode: transfer id -> the reservation's session
        self.free = fleet.config.blocks
        self.epoch = 0
        self._ids = itertools.count()

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

    async def step(self, session: _Session, point: str | None = None, seconds: float | None = None) -> None:
        """One unit of work; raises _Killed, or ends the session if its caller closed it."""
        await asyncio.sleep((self.fleet.config.step_s if seconds is None else seconds) * self.slow)
        if point is not None:
            self.fleet.fire(self, session, point)
        await self.running.wait()
        if self.killed or session.epoch != self.epoch:
            raise _Killed
        if session.closed:
            raise asyncio.CancelledError

    def open_session(self, worker_id: str, blocks: int) -> _Session:
        if self.killed:
            raise WorkerFault(FaultKind.GONE, self.address, f"{self.address}: connection refused")
        if blocks > self.free:
            raise WorkerFault(FaultKind.OVERLOADED, self.address, f"{self.address}: out of KV blocks")
        self.free -= blocks
        session = _Session(worker_id, blocks, epoch=self.epoch)
        self.sessions[worker_id] = session
        return session

    def end_session(self, session: _Session) -> None:
        if session.epoch == self.epoch and self.sessions.pop(session.worker_id, None) is not None:
            self.free += session.blocks
            self.transfers = {t: s for t, s in self.transfers.items() if s is not session}

    def run(self, session: _Session, body) -> None:
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

    def snapshot(self) -> WorkerSnapshot:
        return WorkerSnapshot(self.free, self.fleet.config.blocks, len(self.sessions), 0, False, self.active_blocks)


class FakeCall(Call):
    """The caller's side of one call: a worker that is killed fails it at once, a stalled one
    after the keepalive time; `close` tells the worker, which frees when it next runs."""

    def __init__(self, worker: FakeWorker, session: _Session | None, refused: WorkerFault | None = None):
        self.worker = worker
        self.session = session
        self.refused = refused
        self._done = False

    async def next(self) -> object:
        if self.refused is not None:
            raise self.refused
        if self._done:
            raise StopAsyncIteration
        while True:
            try:
                item = await asyncio.wait_for(self.session.events.get(), self.worker.fleet.config.keepalive_s)
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
        if self.session is not None:
            self.session.closed = True
            if self.session.received is not None and not self.session.received.done():
                self.session.received.cancel()


class FakeDecodeClient(DecodeClient):
    def __init__(self, worker: FakeWorker):
        self.address = worker.address
        self.worker = worker

    def open(self, job: WorkerJob, local_prefill: bool) -> Call:
        w, size = self.worker, self.worker.fleet.config.block_size
        try:
            session = w.open_session(job.request_id, -(-(len(job.prompt) + job.sampling.max_tokens) // size))
        except WorkerFault as fault:
            return FakeCall(w, None, fault)
        session.received = asyncio.get_running_loop().create_future()
        w.run(session, self._serve(job, session, local_prefill))
        return FakeCall(w, session)

    async def _serve(self, job: WorkerJob, session: _Session, local: bool):
        w = self.worker
        await w.step(session, "open")
        if local:
            await w.step(session, seconds=w.fleet.config.step_s * (1 + len(job.prompt) // w.fleet.config.chunk_tokens))
            start = len(job.output_token_ids)
        else:
            transfer_id = f"{job.request_id}#{next(w._ids)}"
            w.transfers[transfer_id] = session
            yield Reservation(transfer_id, "fake", w.address.encode(), tuple(range(session.blocks)),
                              w.fleet.config.block_size, 1, w.address)
            await w.step(session, "reserved")
            await session.received
            await w.step(session, "received")
            start = 1
        for index in range(start, job.sampling.max_tokens):
            await w.step(session, "token")
            yield Tokens((token_at(job.prompt, index),))
        await w.step(session, "last")
        yield Finished(FinishReason.LENGTH, 0, 0)


class FakePrefillClient(PrefillClient):
    def __init__(self, worker: FakeWorker):
        self.address = worker.address
        self.worker = worker

    def open(self, job: WorkerJob, target: Reservation) -> Call:
        w = self.worker
        try:
            session = w.open_session(job.request_id, -(-len(job.prompt) // w.fleet.config.block_size))
        except WorkerFault as fault:
            return FakeCall(w, None, fault)
        w.run(session, self._serve(job, target, session))
        return FakeCall(w, session)

    async def _serve(self, job: WorkerJob, target: Reservation, session: _Session):
        w, cfg = self.worker, self.worker.fleet.config
        await w.step(session, "open")
        for start in range(0, len(job.prompt), cfg.chunk_tokens):
            await w.step(session, "chunk")
            end = min(len(job.prompt), start + cfg.chunk_tokens)
            w.fleet.write(w, target, end // cfg.block_size)
            yield Chunk(start, end - start, 0, cfg.step_s)
        w.fleet.complete(w, target, token_at(job.prompt, 0))
        await w.step(session, "written")
        yield FirstToken(token_at(job.prompt, 0), 0, kv_blocks=len(target.block_ids))

    async def match_prefix(self, token_ids: tuple[int, ...], timeout_s: float) -> int | None:
        return None if self.worker.killed or self.worker.stalled else 0


class FakeFleet(WorkerClients):
    def __init__(self, config: FleetConfig = FleetConfig()):
        self.config = config
        self.workers: dict[str, FakeWorker] = {}
        self.triggers: list[Trigger] = []
        self.partitions: set[tuple[str, str]] = set()

    def add(self, address: str, role: str) -> FakeWorker:
        self.workers[address] = FakeWorker(self, address, role)
        return self.workers[address]

    def active_blocks(self) -> dict[str, int]:
        return {a: w.active_blocks for a, w in self.workers.items()}

    def fire(self, worker: FakeWorker, session: _Session, point: str) -> None:
        for t in self.triggers:
            if not t.fired and t.address == worker.address and t.point == point:
                t.fired = True
                self._apply(t, worker, session)

    def _apply(self, t: Trigger, worker: FakeWorker, session: _Session) -> None:
        if t.mode == Mode.KILL:
            worker.kill()
        elif t.mode == Mode.STALL:
            worker.stall(t.seconds)
        elif t.mode == Mode.SLOW:
            worker.slow = t.factor
        elif t.mode == Mode.FAIL:
            raise WorkerFault(FaultKind.FAILED, worker.address, f"{worker.address}: internal error (injected)")
        elif t.mode == Mode.PARTITION:
            self.partitions |= {(worker.address, d) for d, w in self.workers.items() if w.role == "decode"}

    # ---- the data plane between fake workers ----

    def _reservation(self, prefill: FakeWorker, target: Reservation) -> _Session:
        decode = self.workers.get(target.decode_endpoint)
        session = None
        if decode is not None and not decode.killed and (prefill.address, decode.address) not in self.partitions:
            session = decode.transfers.get(target.transfer_id)
        if session is None or session.closed:
            raise WorkerFault(FaultKind.GONE, prefill.address, f"decode worker {target.decode_endpoint} cannot "
                                                               "take KV", Culprit.PEER)
        return session

    def write(self, prefill: FakeWorker, target: Reservation, blocks: int) -> None:
        self._reservation(prefill, target).written = blocks

    def complete(self, prefill: FakeWorker, target: Reservation, first_token: int) -> None:
        session = self._reservation(prefill, target)
        if not session.received.done():
            session.received.set_result(first_token)

    # ---- WorkerClients ----

    def decode(self, address: str) -> DecodeClient:
        return FakeDecodeClient(self.workers[address])

    def prefill(self, address: str) -> PrefillClient:
        return FakePrefillClient(self.workers[address])

    async def stats(self, address: str, role: str, timeout_s: float) -> WorkerSnapshot:
        worker = self.workers[address]
        if worker.killed:
            raise WorkerFault(FaultKind.GONE, address, f"{address}: connection refused")
        if worker.stalled:
            await asyncio.sleep(timeout_s)
            raise WorkerFault(FaultKind.TIMEOUT, address, f"{address}: Stats timed out", Culprit.NOBODY)
        return worker.snapshot()

    async def forget(self, address: str) -> None:
        return None
