"""One request's path through the workers, as the router drives it (the protocol: router/protocol.py).

    PLACING        choose a decode worker D (wait for one within the deadline) --open--> D
    RESERVING      D reserves KV blocks                       (colocated / resume: LOCAL_PREFILL on D)
    PREFILLING     choose a prefill worker P --open(reservation)--> chunks ... (KV_IN_FLIGHT)
    DECODING       P's first token -> client; D streams the following tokens until Finished
    depart         D leaves (drains, changes role) or is short of blocks: the request departs
                   (router/departing.py), is placed on D', and D moves its KV there (MOVING_KV)
    a WorkerFault in any phase -> router/recovery.py: retry, resume, complete, abort, or fail

A pinned request (a canary, router/canary.py) runs on its pair alone: no admission, no retry.

Every call of an attempt is closed when the attempt ends, however it ends: closing ends the
request on that worker, which frees what it holds there. The decode call is read in the
background from the start, so a decode worker that dies while the prefill runs is seen at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pdserve.aborts import AbortScope
from pdserve.admission import Admission, Verdict
from pdserve.rpc.errors import Unavailable
from pdserve.worker.events import Attached, Chunk, Departed, Finished, FirstToken, Preempted, Tokens
from router.clients import Culprit, FaultKind, Reservation, WorkerClients, WorkerFault, WorkerJob
from router.aborting import FleetAborts
from router.admitting import Admitter, Plan, admission_attributes, defer, refusal
from router.flow_types import ATTACHED, MOVED_KV, FlowConfig, FlowEvent, FlowState, Job, Milestone, NewTokens
from router.departing import Departer, Leaving, LeftFor
from router.local_prefill import LocalPrefillDecision
from router.observed import Observed
from router.placing import Placer
from router.protocol import RequestProtocol, Signal
from router.reattaching import Reattacher
from router.recovery import Action, Decision, charged_to
from router.stream import Pumped
from router.workers import Worker, WorkerPool

log = logging.getLogger(__name__)


class RequestFlow:
    def __init__(self, pool: WorkerPool, clients: WorkerClients, config: FlowConfig):
        self.pool = pool
        self.clients = clients
        self.config = config
        self.observed = Observed()
        self.placer = Placer(pool, clients, config, self.observed)
        self.admitter = Admitter(self.placer.predictor, config.admission, config.local_prefill)
        self.departer = Departer(pool, clients, self.placer, config, self.observed, self._blame)
        self.aborts = FleetAborts(pool, clients)  # Aborts of requests another router runs
        self.reattacher = Reattacher(pool, clients, config.recovery)  # streams continued from another router

    async def run(self, job: Job) -> AsyncIterator[FlowEvent]:
        state = FlowState(RequestProtocol(job.request_id))
        try:
            if job.resume is not None:  # a stream continued here: where its request is, what its client has
                async for event in self.reattacher.begin(job, state):
                    yield event
            while not state.protocol.done:
                try:
                    async for event in self._attempt(job, state):
                        yield event
                except WorkerFault as fault:
                    decision = self._recover(job, state, fault)
                    yield Milestone(decision.action.value, {"pdserve.fault": fault.message,
                                                            "pdserve.fault_kind": fault.kind.value})
                    if decision.action == Action.ABORT:  # through another router: the workers' tombstones are spent
                        await self.aborts.send(job.owner, AbortScope.FORGET)
                    if decision.action in (Action.COMPLETE, Action.ABORT):
                        yield state.done(decision.reason)
        except Exception as exc:
            if not state.protocol.done:
                state.protocol.advance(Signal.FAIL, str(exc))
            raise
        except BaseException:  # cancelled: the client went away, aborted, or a stop string ended it
            if not state.protocol.done:
                state.protocol.advance(Signal.CANCEL)
            raise

    def _recover(self, job: Job, state: FlowState, fault: WorkerFault) -> Decision:
        state.faults.append(fault)
        decision = self.config.recovery.decide(fault, state.faults, state.generated, job.sampling,
                                               state.protocol.faulted_attempts, job.deadline)
        if job.pinned and decision.action in (Action.RETRY, Action.RESUME):  # a canary tries its pair alone
            decision = Decision(Action.FAIL, Unavailable(f"on the pinned pair {job.pin}: {fault.message}"))
        signal = {Action.RETRY: Signal.RETRY, Action.RESUME: Signal.RESUME, Action.COMPLETE: Signal.COMPLETE,
                  Action.ABORT: Signal.CANCEL, Action.FAIL: Signal.FAIL}[decision.action]
        log.warning("request %s in %s: %s -> %s", job.request_id, state.protocol.phase.value, fault,
                    decision.action.value)
        state.protocol.advance(signal, fault.message)
        if decision.action == Action.FAIL:
            raise decision.error
        return decision

    # ---- one attempt ----

    async def _attempt(self, job: Job, state: FlowState) -> AsyncIterator[FlowEvent]:
        state.attachment = 0
        if state.attach is not None:  # a continued stream: the decode worker holding it drives it from here on
            async for event in self._attach(job, state):
                yield event
            return
        departed, state.departed = state.departed, None
        if departed is not None:  # its decode worker left, keeping its KV: it moves to the next one
            decode, _ = await self.placer.decode(job, state)
            local = state.local_prefill = False
        else:
            decode, plan = None, None
            async for event in self._admitted(job, state):
                if isinstance(event, _Admitted):
                    decode, plan = event.decode, event.plan
                else:
                    yield event
            local = plan.local.local
        state.protocol.advance(Signal.PLACED_LOCAL if local else Signal.PLACED, decode.address)
        self.pool.placed(decode)
        opened = time.monotonic()
        worker_job = self._worker_job(job, state, moving_kv=departed is not None)
        call = Pumped(self.clients.decode(decode.address).open(worker_job, local), decode.address)
        yield Milestone("placement", {"pdserve.decode_worker": decode.address, "pdserve.local_prefill": local,
                                      "pdserve.local_prefill.reason": MOVED_KV if departed else plan.local.reason,
                                      "pdserve.decode_cached_tokens": state.decode_cached_tokens})
        if departed is not None:
            head = self._move_kv(job, state, call, decode, departed, opened)
        elif not local:
            head = self._remote_prefill(job, state, call, decode, plan.prefill, opened)
        else:
            head = _nothing()
        async for event in self._drive(job, state, call, decode, worker_job.request_id, head):
            yield event

    async def _attach(self, job: Job, state: FlowState) -> AsyncIterator[FlowEvent]:
        """The attempt a continued stream's decode worker holds (router/reattaching.py), driven here."""
        held, state.attach = state.attach, None
        decode = self.pool.workers.get(held.address)
        state.protocol.advance(Signal.ATTACH, held.address)
        if decode is None:
            raise WorkerFault(FaultKind.LOST, held.address, f"{held.address} left the pool", Culprit.NOBODY)
        self.pool.placed(decode)
        worker_job = dataclasses.replace(self._worker_job(job, state), request_id=held.request_id)
        call = Pumped(self.clients.decode(decode.address).attach(worker_job), decode.address)
        yield Milestone("placement", {"pdserve.decode_worker": decode.address, "pdserve.local_prefill": False,
                                      "pdserve.local_prefill.reason": ATTACHED})
        async for event in self._drive(job, state, call, decode, held.request_id, self._attached(state, call)):
            yield event

    async def _attached(self, state: FlowState, call: Pumped) -> AsyncIterator[FlowEvent]:
        """Attach's first event: the request's tokens so far, those the client lacks relayed."""
        event = await call.next()
        if not isinstance(event, Attached) or tuple(event.token_ids[:len(state.generated)]) != tuple(state.generated):
            raise WorkerFault(FaultKind.LOST, call.address, f"{call.address} attached another request's tokens "
                                                            f"(sent {type(event).__name__})", Culprit.NOBODY)
        state.attachment = event.attachment
        fresh = tuple(event.token_ids[len(state.generated):])
        if fresh:
            state.protocol.advance(Signal.TOKENS)
            state.generated.extend(fresh)
            yield NewTokens(fresh)

    async def _drive(self, job: Job, state: FlowState, call: Pumped, decode: Worker, worker_id: str,
                     head: AsyncIterator[FlowEvent]) -> AsyncIterator[FlowEvent]:
        """An attempt whose decode call is open: `head` (the KV's way in, or an attach), then its
        tokens to the end; a move or a departure ends it without a fault. Its calls closed, however it ends."""
        try:
            async for event in head:
                yield event
            async for event in self._relay(job, state, call, decode, worker_id):
                yield event
            self.pool.credit(decode.address)
        except WorkerFault as fault:
            if fault.address == decode.address:
                self._blame(state, fault, "decode", decode.address)
            raise
        except _Moved as moved:
            state.move_to = moved.target
            log.info("request %s moves from %s to %s: %s", job.request_id, decode.address, moved.target, moved)
            state.protocol.advance(Signal.MOVE, f"{decode.address} -> {moved.target}")
            yield Milestone("moved", {"pdserve.from": decode.address, "pdserve.to": moved.target,
                                      "pdserve.waited_s": moved.waited_s})
        except LeftFor as left:
            state.move_to = left.target
            state.departed = (decode.address, worker_id) if left.kept_kv else None
            state.avoid["decode"][decode.address] = self.pool.incarnation(decode.address)
            log.info("request %s departs from %s (leaving) for %s after %d tokens%s", job.request_id, decode.address,
                     left.target, len(state.generated), "" if left.kept_kv else ", to be prefilled again")
            state.protocol.advance(Signal.DEPART, f"{decode.address} -> {left.target}")
            yield Milestone("departed", {"pdserve.from": decode.address, "pdserve.to": left.target,
                                         "pdserve.generated": len(state.generated), "pdserve.kv_kept": left.kept_kv})
        finally:
            self.pool.left(decode)
            call.close()

    async def _admitted(self, job: Job, state: FlowState) -> AsyncIterator[FlowEvent | _Admitted]:
        """Placement judged by admission: deferred (BATCH) until admitted, refused with a status,
        or admitted: ends with _Admitted (the decode worker and the plan). A pinned job (a canary)
        goes to its pair as it is, or fails at once when that pair is not usable; a later sample of
        n goes to its first sample's decode worker while that is usable, prefilled there."""
        if job.pin is not None:
            decode, prefill = self.placer.pinned(job.pin)
            yield _Admitted(decode, Plan(LocalPrefillDecision(False, "pinned"), prefill,
                                         Admission(Verdict.ADMIT, "pinned", None)))
            return
        beside = self.placer.beside(job.beside) if job.beside is not None and not state.faults else None
        if beside is not None:  # a sample of n: its prompt's KV is on that worker already
            state.local_prefill = True
            yield _Admitted(beside, Plan(LocalPrefillDecision(True, "sample"), None,
                                         Admission(Verdict.ADMIT, "sample", None)))
            return
        deferred_at: float | None = None
        while True:
            decode, cached = await self.placer.decode(job, state)
            decision = await self.placer.local_prefill(job, state, decode, cached)
            waited = 0.0 if deferred_at is None else time.monotonic() - deferred_at
            plan = await self.admitter.judge(job, state, decode, cached, decision, waited)
            if plan.admission.verdict is not Verdict.DEFER:
                break
            if deferred_at is None:
                deferred_at = time.monotonic()
                yield Milestone("admission.deferred", admission_attributes(plan.admission))
            await defer(job, plan.admission.retry_after_s)
        yield Milestone("admission", admission_attributes(plan.admission))
        if plan.admission.verdict is Verdict.REFUSE:
            raise refusal(job, plan.admission, self.admitter.policy.objectives.of(job.priority).ttft_s)
        local = plan.local.local
        state.local_prefill, state.decode_cached_tokens = local, cached if local else 0
        yield _Admitted(decode, plan)

    def _worker_job(self, job: Job, state: FlowState, moving_kv: bool = False) -> WorkerJob:
        """Each attempt has its own id on the workers, so it never meets an earlier attempt, nor
        an earlier request of the client with the same id still ending there. `moving_kv`: the
        KV comes from the decode worker it departed from, of every token but the last, which the
        new worker feeds first (as a prefill's first token)."""
        worker_id = f"{job.request_id}@{state.protocol.attempts}.{secrets.token_hex(4)}"
        out = tuple(state.generated[:-1] if moving_kv else state.generated)
        sampling = dataclasses.replace(job.sampling, prompt_logprobs=None) if out else job.sampling  # sent once
        return WorkerJob(worker_id, job.prompt, sampling, job.priority, self.config.kv_timeout_s,
                         out, job.metadata, job.timeout_s(), job.age_s(),
                         None if job.pinned else job.owner,  # a canary: no client may abort it
                         job.reattachable and self.config.reattach)

    def _blame(self, state: FlowState, fault: WorkerFault, role: str, address: str) -> None:
        """Charge the worker that caused the fault and avoid it for the rest of this request. One
        that gave the request back (leaving its role) is charged nothing, avoided for it, and used
        by nobody until its next poll says what it serves."""
        charged = charged_to(fault)
        if charged is not None:
            self.pool.charge(charged)
        if fault.kind == FaultKind.WITHDRAWN:
            self.pool.gave_back(address)
        if fault.kind != FaultKind.REFUSED and fault.culprit == Culprit.SELF:
            state.avoid[role][address] = self.pool.incarnation(address)

    # ---- phases ----

    async def _remote_prefill(self, job: Job, state: FlowState, decode_call: Pumped, decode: Worker,
                              planned: Worker | None, opened: float) -> AsyncIterator[FlowEvent]:
        reservation = await self._reservation(job, state, decode_call, decode, opened)
        if not isinstance(reservation, Reservation):
            raise WorkerFault(FaultKind.FAILED, decode.address, f"{decode.address} did not reserve KV blocks "
                                                                f"(sent {type(reservation).__name__} first)")
        self.observed.reserved(decode.address, time.monotonic() - opened, reservation.block_size)
        prefill = await self.placer.prefill(job, state, decode, planned)
        state.decode_cached_tokens = reservation.cached_blocks * reservation.block_size
        state.protocol.advance(Signal.RESERVED, prefill.address)
        yield Milestone("placement.prefill", {"pdserve.prefill_worker": prefill.address,
                                              "pdserve.kv_blocks_reserved": len(reservation.block_ids)})
        while True:
            try:
                async for event in self._prefill_on(job, state, decode_call, decode, prefill, reservation):
                    yield event
                return
            except _MovedPrefill as moved:  # queued there while another gives the first token much sooner
                state.protocol.advance(Signal.MOVE, f"{prefill.address} -> {moved.target.address}")
                log.info("request %s moves from %s to %s: %s", job.request_id, prefill.address,
                         moved.target.address, moved)
                yield Milestone("moved", {"pdserve.from": prefill.address, "pdserve.to": moved.target.address,
                                          "pdserve.waited_s": moved.waited_s, "pdserve.role": "prefill"})
                prefill = moved.target

    async def _prefill_on(self, job: Job, state: FlowState, decode_call: Pumped, decode: Worker, prefill: Worker,
                          reservation: Reservation) -> AsyncIterator[FlowEvent]:
        """The prefill on `prefill` into the decode worker's `reservation`, to the first token."""
        self.pool.placed(prefill, len(job.prompt) + len(state.generated))
        self.pool.links.trial(prefill.address, decode.address)
        call = Pumped(self.clients.prefill(prefill.address).open(self._worker_job(job, state), reservation),
                      prefill.address)
        try:
            async for event in self._prefill_events(job, state, call, decode_call, decode, prefill):
                yield event
            self.pool.credit(prefill.address)
            self.pool.link_delivered(prefill.address, decode.address)
        except WorkerFault as fault:
            if fault.kind == FaultKind.CORRUPT:  # its KV landed corrupt (seen by either stream): the prefill worker's
                fault = WorkerFault(FaultKind.CORRUPT, prefill.address, fault.message)
                self._blame(state, fault, "prefill", prefill.address)
                raise fault from None
            if fault.culprit == Culprit.PEER:  # the decode worker's fault, seen through the prefill stream
                state.avoid["prefill"][prefill.address] = self.pool.incarnation(prefill.address)  # (not charged)
                self.pool.link_failed(prefill.address, decode.address, fault.message)
                raise WorkerFault(FaultKind.GONE, decode.address, fault.message) from None
            if fault.address == prefill.address:
                self._blame(state, fault, "prefill", prefill.address)
            raise
        finally:
            self.pool.left(prefill)
            call.close()

    async def _reservation(self, job: Job, state: FlowState, call: Pumped, decode: Worker, opened: float) -> object:
        """The decode worker's first event. While it keeps the request queued for blocks (longer
        than move_after_s), a decode worker with room now takes the request instead: raises _Moved
        (the caller closes this call, which takes it out of that queue)."""
        config = self.config
        while True:
            try:  # asyncio.timeout, not wait_for: wait_for can swallow a cancel (an Abort) that meets its result
                async with asyncio.timeout(config.move_check_s):
                    return await call.next()
            except TimeoutError:
                waited = time.monotonic() - opened
                if waited < config.move_after_s or state.protocol.moves >= config.max_moves:
                    continue
                target = self.placer.roomier_decode(job, state, decode, self.observed.block_size(decode.address))
                if target is not None:
                    raise _Moved(target.address, waited) from None

    async def _prefill_events(self, job: Job, state: FlowState, call: Pumped, decode_call: Pumped, decode: Worker,
                              prefill: Worker) -> AsyncIterator[FlowEvent]:
        chunks, opened, address = 0, time.monotonic(), prefill.address
        while True:
            try:
                if chunks:
                    event = await decode_call.unless_failed(call.next())
                else:
                    event = await self._first_prefill_event(job, state, call, decode_call, decode, prefill, opened)
            except StopAsyncIteration:
                raise WorkerFault(FaultKind.FAILED, address, "the prefill worker ended the stream without "
                                                             "a first token") from None
            if isinstance(event, Chunk):
                chunks += 1
                state.protocol.advance(Signal.CHUNK)
                yield Milestone("prefill.chunk", {"tokens": event.num_tokens, "start": event.start,
                                                  "cached_tokens": event.cached_tokens,
                                                  "step_seconds": event.step_seconds})
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

    async def _first_prefill_event(self, job: Job, state: FlowState, call: Pumped, decode_call: Pumped,
                                   decode: Worker, prefill: Worker, opened: float) -> object:
        """The prefill worker's first event. While it has computed nothing of the request (queued
        there longer than move_after_s), a prefill worker predicted to give the first token much
        sooner takes it: raises _MovedPrefill (the caller closes this call, which takes the request
        out of that queue, and opens one there into the same reservation)."""
        config = self.config
        while True:
            try:  # asyncio.timeout, not wait_for (see _reservation)
                async with asyncio.timeout(config.move_check_s):
                    return await decode_call.unless_failed(call.next())
            except TimeoutError:
                waited = time.monotonic() - opened
                if waited < config.move_after_s or state.protocol.moves >= config.max_moves:
                    continue
                target = self.placer.sooner_prefill(job, state, prefill, decode)
                if target is not None:
                    raise _MovedPrefill(target, waited) from None

    async def _move_kv(self, job: Job, state: FlowState, call: Pumped, decode: Worker, departed: tuple[str, str],
                       opened: float) -> AsyncIterator[FlowEvent]:
        """The decode worker the request departed from sends its KV into this one's reservation
        (router/departing.py); a failure resumes the request through the prefill pool."""
        reservation = await self._reservation(job, state, call, decode, opened)
        if not isinstance(reservation, Reservation):
            raise WorkerFault(FaultKind.FAILED, decode.address, f"{decode.address} did not reserve KV blocks "
                                                                f"(sent {type(reservation).__name__} first)")
        self.observed.reserved(decode.address, time.monotonic() - opened, reservation.block_size)
        state.decode_cached_tokens = reservation.cached_blocks * reservation.block_size
        state.protocol.advance(Signal.MOVE_KV, departed[0])
        moved = await self.departer.move_kv(state, call, decode, departed, reservation)
        state.protocol.advance(Signal.KV_MOVED)
        state.kv_bytes += moved.kv_bytes
        yield Milestone("kv_move", {"pdserve.from": departed[0], "bytes": moved.kv_bytes, "blocks": moved.kv_blocks,
                                    "seconds": moved.kv_seconds})

    async def _relay(self, job: Job, state: FlowState, call: Pumped, decode: Worker,
                     worker_id: str) -> AsyncIterator[FlowEvent]:
        """The decode worker's tokens to the end. While that worker is leaving (draining or
        changing role), or under memory pressure, the request departs for another decode
        worker: raises LeftFor once every token it generated there is out."""
        leaving = Leaving()
        while True:
            try:
                event = await call.next_within(self.config.move_check_s)
            except StopAsyncIteration:
                raise WorkerFault(FaultKind.FAILED, call.address, "the decode worker ended the stream without "
                                                                  "finishing the request") from None
            if isinstance(event, Tokens):
                state.protocol.advance(Signal.TOKENS)
                state.generated.extend(event.token_ids)
                yield NewTokens(event.token_ids, event.logprobs, event.prompt_logprobs)
            elif isinstance(event, Preempted):
                if event.phase == "preempted":  # counted here, on every attempt: a moved or resumed stream's
                    state.by_mode[event.mode] = state.by_mode.get(event.mode, 0) + 1  # earlier ones too
                    state.preemptions += 1
                yield Milestone(f"decode.{event.phase}", {"mode": event.mode, "reason": event.reason})
            elif isinstance(event, Finished):
                state.protocol.advance(Signal.FINISHED)
                yield state.done(event.reason, event.cached_tokens)
                return
            elif isinstance(event, Departed):  # (target None: its Depart call failed, yet it left)
                if event.generated != len(state.generated):
                    raise WorkerFault(FaultKind.FAILED, decode.address, f"departed after {event.generated} tokens, "
                                      f"{len(state.generated)} received") from None
                raise LeftFor(leaving.target, event.kv_kept)
            if self.departer.wants(job, state, decode, leaving):
                await self.departer.ask(job, state, decode, worker_id, leaving)

async def _nothing() -> AsyncIterator[FlowEvent]:
    return
    yield


@dataclass(frozen=True)
class _Admitted:
    decode: Worker
    plan: Plan


class _MovedPrefill(Exception):
    """The request leaves a prefill worker's queue for `target`, predicted much sooner."""

    def __init__(self, target: Worker, waited_s: float):
        super().__init__(f"moved to {target.address} after {waited_s:.1f} s queued")
        self.target, self.waited_s = target, waited_s


class _Moved(Exception):
    """The request leaves its decode worker's queue for `target`, which has room now."""

    def __init__(self, target: str, waited_s: float):
        super().__init__(f"moved to {target} after {waited_s:.1f} s queued")
        self.target, self.waited_s = target, waited_s
