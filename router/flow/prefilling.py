"""PREFILLING: a remote prefill into an attempt's reservation, to the first token (router/flow/flow.py
opens the decode call; router/flow/reserving.py waits for its reservation).

    RESERVING      the decode worker D reserves KV blocks ──▶ choose a prefill worker P
    PREFILLING     P --open(reservation)--> chunks ... (KV_IN_FLIGHT) ... P's first token -> client
    moved          P has computed nothing yet, queued longer than move_after_s, while another
                   prefill worker is predicted to give the first token much sooner: P's call is
                   closed (out of its queue) and one opened there, into the same reservation

Reserved when the prefill starts (FlowConfig.reserve_at PREFILL, the default), the order turns:

    STARTING       P --open(no reservation)--> queued there (moved to a sooner one as above)
    HELD           P's first chunk: the prompt started, its KV held on P ──▶ D opened, reserves
    KV_IN_FLIGHT   P --set_target(reservation)--> what P held goes out, then chunks ... first token

so a prompt queued behind others on the prefill workers holds no decode blocks (`start`, `fill`).

A fault of the prefill call is charged to P, or to D when it is D's seen through P's stream
(its KV link is out: router/fleet/links.py); the prefill call is closed however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pdserve.worker.events import Chunk, FirstToken
from router.fleet.clients import Culprit, FaultKind, Reservation, WorkerClients, WorkerFault
from router.fleet.workers import Worker, WorkerPool
from router.flow.flow_types import (Attempt, Blame, FlowConfig, FlowEvent, FlowState, Job, Milestone, NewTokens,
                                    worker_job)
from router.flow.protocol import Signal
from router.flow.reserving import Reserver, first_event
from router.flow.stream import Pumped
from router.placement.observed import Observed
from router.placement.placing import Placer

log = logging.getLogger(__name__)


class MovedPrefill(Exception):
    """The request leaves a prefill worker's queue for `target`, predicted much sooner."""

    def __init__(self, target: Worker, waited_s: float):
        super().__init__(f"moved to {target.address} after {waited_s:.1f} s queued")
        self.target, self.waited_s = target, waited_s


@dataclass(frozen=True)
class Started:
    """A prefill opened without its reservation, begun: its call (read from its second event on),
    its id on the prefill worker, and that worker."""

    prefill: Worker
    call: Pumped
    worker_id: str


class Prefiller:
    def __init__(self, pool: WorkerPool, clients: WorkerClients, config: FlowConfig, placer: Placer,
                 observed: Observed, reserver: Reserver, blame: Blame):
        self.pool = pool
        self.clients = clients
        self.config = config
        self.placer = placer
        self.observed = observed
        self.reserver = reserver
        self.blame = blame

    async def prefill(self, attempt: Attempt, planned: Worker | None) -> AsyncIterator[FlowEvent]:
        """The reservation, then the prefill on `planned` (or the prefill worker placement takes now)
        into it, moving to a sooner one while queued, to the first token."""
        job, state, decode = attempt.job, attempt.state, attempt.decode
        reservation = await self.reserver.reserved(attempt)
        prefill = await self.placer.prefill(job, state, decode, planned)
        state.decode_cached_tokens = reservation.cached_blocks * reservation.block_size
        state.protocol.advance(Signal.RESERVED, prefill.address)
        yield Milestone("placement.prefill", {"pdserve.prefill_worker": prefill.address,
                                              "pdserve.kv_blocks_reserved": len(reservation.block_ids)})
        while True:
            try:
                async for event in self._on(attempt, prefill, reservation):
                    yield event
                return
            except MovedPrefill as moved:  # queued there while another gives the first token much sooner
                state.protocol.advance(Signal.MOVE, f"{prefill.address} -> {moved.target.address}")
                log.info("request %s moves from %s to %s: %s", job.request_id, prefill.address,
                         moved.target.address, moved)
                yield Milestone("moved", {"pdserve.from": prefill.address, "pdserve.to": moved.target.address,
                                          "pdserve.waited_s": moved.waited_s, "pdserve.role": "prefill"})
                prefill = moved.target

    async def _on(self, attempt: Attempt, prefill: Worker, reservation: Reservation) -> AsyncIterator[FlowEvent]:
        """The prefill on `prefill` into the decode worker's `reservation`, to the first token."""
        job, state, decode = attempt.job, attempt.state, attempt.decode
        self.pool.placed(prefill, len(job.prompt) + len(state.generated))
        self.pool.links.trial(prefill.address, decode.address)
        call = Pumped(self.clients.prefill(prefill.address).open(worker_job(job, state, self.config), reservation),
                      prefill.address)
        try:
            async for event in self._delivered(attempt, prefill, self._events(attempt, call, prefill)):
                yield event
        finally:
            self.pool.left(prefill)
            call.close()

    async def _delivered(self, attempt: Attempt, prefill: Worker,
                         events: AsyncIterator[FlowEvent]) -> AsyncIterator[FlowEvent]:
        """`events` of a prefill into the attempt's reservation; its faults charged to whom they are due."""
        state, decode = attempt.state, attempt.decode
        try:
            async for event in events:
                yield event
            self.pool.credit(prefill.address)
            self.pool.link_delivered(prefill.address, decode.address)
        except WorkerFault as fault:
            if fault.kind == FaultKind.CORRUPT:  # its KV landed corrupt (seen by either stream): the prefill worker's
                fault = WorkerFault(FaultKind.CORRUPT, prefill.address, fault.message)
                self.blame(state, fault, "prefill", prefill.address)
                raise fault from None
            if fault.culprit == Culprit.PEER:  # the decode worker's fault, seen through the prefill stream
                state.avoid["prefill"][prefill.address] = self.pool.incarnation(prefill.address)  # (not charged)
                self.pool.link_failed(prefill.address, decode.address, fault.message)
                raise WorkerFault(FaultKind.GONE, decode.address, fault.message) from None
            if fault.address == prefill.address:
                self.blame(state, fault, "prefill", prefill.address)
            raise

    # ---- reserved when the prefill starts ----

    async def start(self, job: Job, state: FlowState, decode: Worker,
                    prefill: Worker) -> AsyncIterator[FlowEvent | Started]:
        """A prefill on `prefill` whose reservation follows, to its first chunk (moving to a sooner
        prefill worker while queued): ends with Started, whose call the caller closes."""
        yield Milestone("placement.prefill", {"pdserve.prefill_worker": prefill.address, "pdserve.reserve_at": "prefill"})
        while True:
            on_worker = worker_job(job, state, self.config)
            self.pool.placed(prefill, len(job.prompt) + len(state.generated))
            call = Pumped(self.clients.prefill(prefill.address).open(on_worker, None), prefill.address)
            started = Started(prefill, call, on_worker.request_id)
            try:
                first = await self._started(job, state, decode, started)
            except MovedPrefill as moved:  # queued there while another gives the first token much sooner
                state.protocol.advance(Signal.MOVE, f"{prefill.address} -> {moved.target.address}")
                yield Milestone("moved", {"pdserve.from": prefill.address, "pdserve.to": moved.target.address,
                                          "pdserve.waited_s": moved.waited_s, "pdserve.role": "prefill"})
                prefill = moved.target
                continue
            state.protocol.advance(Signal.CHUNK)
            try:
                yield _chunk_milestone(first)
            except BaseException:  # closed here, before the caller has it
                self.close(started)
                raise
            yield started
            return

    async def _started(self, job: Job, state: FlowState, decode: Worker, started: Started) -> Chunk:
        """The started prefill's first chunk; whatever else comes, its call closed (and a fault of
        the prefill worker charged to it)."""
        prefill = started.prefill
        try:
            first = await first_event(started.call.next, state, self.config, time.monotonic(),
                                      lambda waited: self._sooner(job, state, prefill, decode, waited))
            if not isinstance(first, Chunk):
                raise WorkerFault(FaultKind.FAILED, prefill.address, f"{prefill.address} sent "
                                  f"{type(first).__name__} before its reservation")
            return first
        except BaseException as exc:
            self.close(started)
            if isinstance(exc, StopAsyncIteration):
                raise WorkerFault(FaultKind.FAILED, prefill.address, "the prefill worker ended the stream before "
                                                                     "it started") from None
            if isinstance(exc, WorkerFault) and exc.address == prefill.address:
                self.blame(state, exc, "prefill", prefill.address)
            raise

    def close(self, started: Started) -> None:
        self.pool.left(started.prefill)
        started.call.close()

    async def fill(self, attempt: Attempt, started: Started) -> AsyncIterator[FlowEvent]:
        """The decode worker's reservation (once the prefill started), handed to the prefill worker:
        what it held goes out, then the rest, to the first token."""
        state, decode, prefill = attempt.state, attempt.decode, started.prefill
        reservation = await self.reserver.reserved(attempt)
        state.decode_cached_tokens = reservation.cached_blocks * reservation.block_size
        state.protocol.advance(Signal.RESERVED, prefill.address)
        yield Milestone("reserved", {"pdserve.kv_blocks_reserved": len(reservation.block_ids),
                                     "pdserve.decode_worker": decode.address})
        self.pool.links.trial(prefill.address, decode.address)
        async for event in self._delivered(attempt, prefill, self._filled(attempt, started, reservation)):
            yield event

    async def _filled(self, attempt: Attempt, started: Started, reservation: Reservation) -> AsyncIterator[FlowEvent]:
        client = self.clients.prefill(started.prefill.address)
        try:
            await attempt.call.unless_failed(client.set_target(started.worker_id, reservation,
                                                               self.config.kv_timeout_s))
        except WorkerFault as fault:
            if fault.kind is FaultKind.LOST:  # it ended there: its stream says why (an Abort, a failure)
                await self._ended(attempt, started)
            raise
        async for event in self._events(attempt, started.call, started.prefill, chunks=1):
            yield event

    async def _ended(self, attempt: Attempt, started: Started) -> None:
        """Raises the fault the prefill stream ended with, if it ends within a probe's time."""
        with contextlib.suppress(TimeoutError, StopAsyncIteration):
            async with asyncio.timeout(self.config.probe_timeout_s):
                while True:
                    await attempt.call.unless_failed(started.call.next())

    async def _events(self, attempt: Attempt, call: Pumped, prefill: Worker,
                      chunks: int = 0) -> AsyncIterator[FlowEvent]:
        """The prefill's events to its first token (`chunks`: those read already)."""
        state, decode_call = attempt.state, attempt.call
        opened, address = time.monotonic(), prefill.address
        while True:
            try:
                if chunks:
                    event = await decode_call.unless_failed(call.next())
                else:
                    event = await self._first_event(attempt, call, prefill, opened)
            except StopAsyncIteration:
                raise WorkerFault(FaultKind.FAILED, address, "the prefill worker ended the stream without "
                                                             "a first token") from None
            if isinstance(event, Chunk):
                chunks += 1
                state.protocol.advance(Signal.CHUNK)
                yield _chunk_milestone(event)
            elif isinstance(event, FirstToken):
                state.protocol.advance(Signal.FIRST_TOKEN)
                state.cached_tokens = event.cached_tokens
                state.kv_bytes += event.kv_bytes
                self.observed.sent(address, event.kv_seconds, chunks)
                yield Milestone("kv_transfer", {"bytes": event.kv_bytes, "blocks": event.kv_blocks,
                                                "descriptors": event.kv_descriptors, "seconds": event.kv_seconds,
                                                "queue_seconds": event.queue_seconds})
                state.generated.append(event.token_id)
                yield NewTokens((event.token_id,), () if event.logprobs is None else (event.logprobs,),
                                event.prompt_logprobs)
                return

    async def _first_event(self, attempt: Attempt, call: Pumped, prefill: Worker, opened: float) -> object:
        """The prefill worker's first event. While it has computed nothing of the request (queued
        there longer than move_after_s), a prefill worker predicted to give the first token much
        sooner takes it: raises MovedPrefill (the caller closes this call, which takes the request
        out of that queue, and opens one there into the same reservation)."""
        return await first_event(lambda: attempt.call.unless_failed(call.next()), attempt.state, self.config, opened,
                                 lambda waited: self._sooner(attempt.job, attempt.state, prefill, attempt.decode,
                                                             waited))

    def _sooner(self, job: Job, state: FlowState, prefill: Worker, decode: Worker,
                waited: float) -> MovedPrefill | None:
        target = self.placer.sooner_prefill(job, state, prefill, decode)
        return None if target is None else MovedPrefill(target, waited)


def _chunk_milestone(event: Chunk) -> Milestone:
    return Milestone("prefill.chunk", {"tokens": event.num_tokens, "start": event.start,
                                       "cached_tokens": event.cached_tokens, "step_seconds": event.step_seconds})
