"""A fleet of fake workers behind the worker-client interface (see tests/router/fake_workers.py).

`FakeFleet` is a `WorkerClients`: the router's flow and pool use it as they use the gRPC
clients. Its fake data plane carries a prefill worker's writes into a decode worker's
reservation, unless the decode worker is dead, the reservation is gone, or the two are
partitioned: then the prefill worker fails with its peer named (Culprit.PEER).

`RouterLink` is one router's view of the fleet: `cut` (the router died), its calls end without
ending their requests, and a reattachable request decoding there is orphaned for another router's
link to find and attach (pdserve/reattach.py), as a real decode worker keeps it for its grace.
"""

from __future__ import annotations

import asyncio

from pdserve.aborts import AbortScope, Owner
from pdserve.reattach import HeldAttempt, prompt_digest
from pdserve.requests import FinishReason
from pdserve.worker.events import Attached, Chunk, Departed, Finished, FirstToken, Tokens
from router.fleet.clients import Call, DecodeClient, Departure, MovedKV, PrefillClient, Reservation
from router.fleet.clients import Culprit, FaultKind, WorkerClients, WorkerFault, WorkerJob, WorkerSnapshot
from tests.router.fake_workers import (FakeCall, FakeWorker, FleetConfig, Link, Mode, Trigger, FakeSession, logprobs_at,
                                       token_at)


class FakeDecodeClient(DecodeClient):
    def __init__(self, worker: FakeWorker, link: Link | None = None):
        self.address = worker.address
        self.worker = worker
        self.link = link

    def open(self, job: WorkerJob, local_prefill: bool) -> Call:
        w, size = self.worker, self.worker.fleet.config.block_size
        if w.next_role or w.role != "decode":  # changing role, or changed: it gives new decode work back
            return FakeCall(w, None, WorkerFault(FaultKind.WITHDRAWN, w.address, f"{w.address}: leaving decode"))
        try:
            session = w.open_session(job.request_id, -(-(len(job.prompt) + job.sampling.max_tokens) // size),
                                     job.owner)
        except WorkerFault as fault:
            return FakeCall(w, None, fault)
        session.received = asyncio.get_running_loop().create_future()
        session.prompt, session.reattachable, session.local = job.prompt, job.reattachable, local_prefill
        session.tokens.extend(job.output_token_ids)
        w.run(session, self._serve(job, session, local_prefill))
        return FakeCall(w, session, link=self.link)

    async def _serve(self, job: WorkerJob, session: FakeSession, local: bool):
        w = self.worker
        await w.step(session, "open")
        if local:
            await w.step(session, seconds=w.fleet.config.step_s * (1 + len(job.prompt) // w.fleet.config.chunk_tokens))
            start = len(job.output_token_ids)
        else:
            transfer_id = f"{job.request_id}#{next(w._ids)}"
            w.transfers[transfer_id] = session
            while not w.reserving.is_set():  # queued for blocks while a test holds it (ends if closed)
                await w.step(session)
            yield Reservation(transfer_id, "fake", w.address.encode(), tuple(range(session.blocks)),
                              w.fleet.config.block_size, 1, w.address, b"fake", session.blocks)
            await w.step(session, "reserved")
            session.tokens.append(await session.received)
            await w.step(session, "received")
            start = len(job.output_token_ids) + 1  # the prefill worker sent the token after them
        for index in range(start, job.sampling.max_tokens):
            await w.step(session, "token")
            if session.departing is not None:  # Depart: it stops between two tokens, its KV kept
                if session.keep_kv_s is not None:
                    w.hold(job.request_id, session, token_at(job.prompt, index - 1))
                yield Departed(index, session.keep_kv_s is not None)
                session.departing.set_result(index)
                w.fleet.fire(w, session, "departed")
                return
            session.tokens.append(token_at(job.prompt, index) + w.skew)
            yield Tokens((session.tokens[-1],), logprobs_at(job.prompt, index, job.sampling.logprobs))
        await w.step(session, "last")
        yield Finished(FinishReason.LENGTH, 0, 0)

    async def match_prefix(self, token_ids: tuple[int, ...], timeout_s: float) -> int | None:
        return self.worker.cached_prefix(token_ids)

    async def depart(self, worker_id: str, keep_kv_s: float | None, timeout_s: float,
                     attachment: int = 0) -> Departure:
        w = await self._reachable()
        session = w.sessions.get(worker_id)
        if session is None or session.closed or session.attachment != attachment:
            return Departure(False, 0, f"no request {worker_id!r} is running here")
        if session.received is not None and not session.received.done():
            return Departure(False, 0, "its KV is still arriving")
        if session.departing is None:
            session.departing, session.keep_kv_s = asyncio.get_running_loop().create_future(), keep_kv_s
        return Departure(True, await session.departing, kv_kept=keep_kv_s is not None)

    async def move_kv(self, worker_id: str, target: Reservation, timeout_s: float) -> MovedKV:
        w = await self._reachable()
        w.fleet.fire(w, FakeSession(worker_id, 0, epoch=w.epoch), "move")
        w = await self._reachable()
        held = w.held.get(worker_id)
        if held is None:
            raise WorkerFault(FaultKind.REFUSED, w.address, f"{w.address}: no request {worker_id!r} departed here")
        await asyncio.sleep(w.fleet.config.step_s * w.slow)
        w = await self._reachable()
        try:
            w.fleet.write(w, target, len(target.block_ids))
            w.fleet.complete(w, target, held.last_token)
        finally:
            w.release(worker_id)
        return MovedKV(len(target.block_ids) - target.cached_blocks, len(target.block_ids) - target.cached_blocks, 0.0)

    async def find(self, owner: Owner, digest: bytes, timeout_s: float) -> list[HeldAttempt] | None:
        try:
            w = await self._reachable()
        except WorkerFault:
            return None
        return [HeldAttempt(s.worker_id, tuple(s.tokens), s.attachable, s.orphaned, s.attachment, w.address)
                for s in w.sessions.values()
                if s.owner == owner and not s.closed and prompt_digest(s.prompt) == digest]

    def attach(self, job: WorkerJob) -> Call:
        w = self.worker
        session = w.sessions.get(job.request_id)
        if w.killed or session is None or session.closed or session.owner != job.owner or not session.attachable:
            return FakeCall(w, None, WorkerFault(FaultKind.LOST, w.address, f"{w.address}: no attachable "
                                                 f"{job.request_id!r}", Culprit.NOBODY))
        previous, session.events = session.events, asyncio.Queue()
        if not session.orphaned:  # its router only stalled: its call ends, the request goes on here
            previous.put_nowait(WorkerFault(FaultKind.TAKEN, w.address, "attached elsewhere", Culprit.NOBODY))
        session.orphaned, session.attachment = False, session.attachment + 1
        session.events.put_nowait(Attached(tuple(session.tokens), session.attachment))
        return FakeCall(w, session, link=self.link)

    async def abort_attempt(self, worker_id: str, attachment: int, timeout_s: float) -> bool | None:
        try:
            w = await self._reachable()
        except WorkerFault:
            return None
        session = w.sessions.get(worker_id)
        if session is None or session.closed or session.attachment != attachment:
            return False
        session.events.put_nowait(WorkerFault(FaultKind.ABORTED, w.address, "aborted", Culprit.NOBODY))
        session.closed = True
        return True

    async def _reachable(self) -> FakeWorker:
        """The worker, if a unary call reaches it: GONE when killed, or after the keepalive when stalled."""
        w = self.worker
        if w.stalled:
            await asyncio.sleep(w.fleet.config.keepalive_s)
        if w.killed or w.stalled:
            raise WorkerFault(FaultKind.GONE, w.address, f"{w.address}: unavailable")
        return w


class FakePrefillClient(PrefillClient):
    def __init__(self, worker: FakeWorker):
        self.address = worker.address
        self.worker = worker

    def open(self, job: WorkerJob, target: Reservation | None) -> Call:
        w = self.worker
        try:
            session = w.open_session(job.request_id, -(-_kv_tokens(job) // w.fleet.config.block_size), job.owner)
        except WorkerFault as fault:
            return FakeCall(w, None, fault)
        if target is None:
            session.target = asyncio.get_running_loop().create_future()
        w.run(session, self._serve(job, target, session))
        return FakeCall(w, session)

    async def set_target(self, worker_id: str, target: Reservation, timeout_s: float) -> None:
        w = self.worker
        if w.killed:
            raise WorkerFault(FaultKind.GONE, w.address, f"{w.address}: connection refused")
        session = w.sessions.get(worker_id)
        if session is None or session.closed or session.target is None or session.target.done():
            raise WorkerFault(FaultKind.LOST, w.address, f"{w.address}: no prefill {worker_id} awaits a target",
                              Culprit.NOBODY)
        session.target.set_result(target)

    async def _serve(self, job: WorkerJob, target: Reservation | None, session: FakeSession):
        """Chunks written into the reservation as they are computed; without one, the KV computed
        waits here (a "held" point every step) until set_target brings it."""
        w, cfg = self.worker, self.worker.fleet.config
        await w.step(session, "open")
        while not w.reserving.is_set():  # queued behind other prompts while a test holds it (ends if closed)
            await w.step(session)
        kv_tokens, index = _kv_tokens(job), len(job.output_token_ids)  # a resume: the token after those out
        for start in range(0, kv_tokens, cfg.chunk_tokens):
            await w.step(session, "chunk")
            end = min(kv_tokens, start + cfg.chunk_tokens)
            if target is None and session.target.done():
                target = session.target.result()
            if target is not None:
                w.fleet.write(w, target, end // cfg.block_size)
            yield Chunk(start, end - start, 0, cfg.step_s)
        while target is None:
            await w.step(session, "held")
            target = session.target.result() if session.target.done() else None
        w.fleet.write(w, target, kv_tokens // cfg.block_size)
        w.fleet.complete(w, target, token_at(job.prompt, index))
        await w.step(session, "written")
        first = logprobs_at(job.prompt, index, job.sampling.logprobs)
        yield FirstToken(token_at(job.prompt, index), 0, kv_blocks=len(target.block_ids),
                         logprobs=first[0] if first else None)

    async def match_prefix(self, token_ids: tuple[int, ...], timeout_s: float) -> int | None:
        return self.worker.cached_prefix(token_ids)


def _kv_tokens(job: WorkerJob) -> int:
    """The tokens whose KV a prefill sends: the prompt's, and a resume's tokens so far."""
    return len(job.prompt) + len(job.output_token_ids)


class FakeFleet(WorkerClients):
    def __init__(self, config: FleetConfig = FleetConfig()):
        self.config = config
        self.workers: dict[str, FakeWorker] = {}
        self.triggers: list[Trigger] = []
        self.partitions: set[tuple[str, str]] = set()

    def add(self, address: str, role: str) -> FakeWorker:
        self.workers[address] = FakeWorker(self, address, role)
        return self.workers[address]

    async def set_role(self, address: str, role: str, timeout_s: float) -> tuple[str, str]:
        w = self.workers[address]
        if w.killed:
            raise WorkerFault(FaultKind.GONE, address, f"{address}: connection refused")
        if not w.elastic:
            raise WorkerFault(FaultKind.FAILED, address, f"{address}: UNIMPLEMENTED (not an elastic worker)")
        w.next_role = "" if role == w.role else role
        w.settle_role()
        return w.role, w.next_role

    def active_blocks(self) -> dict[str, int]:
        return {a: w.active_blocks for a, w in self.workers.items()}

    def fire(self, worker: FakeWorker, session: FakeSession, point: str) -> None:
        for t in self.triggers:
            if not t.fired and t.address == worker.address and t.point == point:
                t.fired = True
                if t.then is not None:
                    self.triggers.append(t.then)
                self._apply(t, worker, session)

    def _apply(self, t: Trigger, worker: FakeWorker, session: FakeSession) -> None:
        if t.mode == Mode.KILL:
            worker.kill()
        elif t.mode == Mode.STALL:
            worker.stall(t.seconds)
        elif t.mode == Mode.SLOW:
            worker.slow = t.factor
        elif t.mode == Mode.FAIL:
            raise WorkerFault(FaultKind.FAILED, worker.address, f"{worker.address}: internal error (injected)")
        elif t.mode == Mode.CALL:
            t.then_call()
        elif t.mode == Mode.PARTITION:
            self.partitions |= {(worker.address, d) for d, w in self.workers.items() if w.role == "decode"}

    # ---- the data plane between fake workers ----

    def _reservation(self, prefill: FakeWorker, target: Reservation) -> FakeSession:
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

    def link(self) -> RouterLink:
        """A router's own connection to this fleet (cut it: the router died)."""
        return RouterLink(self)

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

    async def abort(self, address: str, role: str, owner: Owner, scope: AbortScope, timeout_s: float) -> bool | None:
        worker = self.workers[address]
        if worker.stalled or worker.abort_answer_s > timeout_s:
            await asyncio.sleep(timeout_s)
            return None
        await asyncio.sleep(worker.abort_answer_s)
        return None if worker.killed or worker.stalled else worker.abort(owner, scope)

    async def forget(self, address: str) -> None:
        return None


class RouterLink(WorkerClients):
    """One router's connection to a FakeFleet; `cut` once the router is gone."""

    def __init__(self, fleet: FakeFleet):
        self.fleet = fleet
        self.cut = False

    def decode(self, address: str) -> DecodeClient:
        return FakeDecodeClient(self.fleet.workers[address], self)

    def prefill(self, address: str) -> PrefillClient:
        return self.fleet.prefill(address)

    async def stats(self, address: str, role: str, timeout_s: float) -> WorkerSnapshot:
        return await self.fleet.stats(address, role, timeout_s)

    async def set_role(self, address: str, role: str, timeout_s: float) -> tuple[str, str]:
        return await self.fleet.set_role(address, role, timeout_s)

    async def abort(self, address: str, role: str, owner: Owner, scope: AbortScope, timeout_s: float) -> bool | None:
        return await self.fleet.abort(address, role, owner, scope, timeout_s)

    async def forget(self, address: str) -> None:
        return None
