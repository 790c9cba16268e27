"""One request's path through the workers, as the router drives it (the protocol: router/flow/protocol.py):
its attempts, each placed and admitted here, then driven through its phases.

    PLACING        choose a decode worker D (wait for one within the deadline) --open--> D
    RESERVING      D reserves KV blocks (router/flow/reserving.py)   (colocated / resume: LOCAL_PREFILL on D)
    PREFILLING     choose a prefill worker P --open(reservation)--> chunks ... (KV_IN_FLIGHT)
                   (router/flow/prefilling.py)
    DECODING       P's first token -> client; D streams the following tokens until Finished
                   (router/flow/decoding.py)
    depart         D leaves (drains, changes role) or is short of blocks: the request departs
                   (router/flow/departing.py), is placed on D', and D moves its KV there (MOVING_KV)
    a WorkerFault in any phase -> router/flow/recovery.py: retry, resume, complete, abort, or fail

A pinned request (a canary, router/fleet/canary.py) runs on its pair alone: no admission, no retry.

Every call of an attempt is closed when the attempt ends, however it ends: closing ends the
request on that worker, which frees what it holds there. The decode call is read in the
background from the start, so a decode worker that dies while the prefill runs is seen at once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pdserve.aborts import AbortScope
from pdserve.admission import Admission, Verdict
from pdserve.rpc.errors import Unavailable
from pdserve.worker.events import Attached
from router.doors.aborting import FleetAborts
from router.fleet.clients import Culprit, FaultKind, WorkerClients, WorkerFault
from router.fleet.workers import Worker, WorkerPool
from router.flow.decoding import Decoder
from router.flow.departing import Departer
from router.flow.flow_types import (ATTACHED, MOVED_KV, Attempt, FlowConfig, FlowEvent, FlowState, Job, Milestone,
                                    NewTokens, Outlet, ReserveAt, worker_job)
from router.flow.prefilling import Prefiller, Started
from router.flow.protocol import RequestProtocol, Signal
from router.flow.reattaching import Reattacher
from router.flow.recovery import Action, Decision, charged_to
from router.flow.reserving import Reserver
from router.flow.stream import Pumped
from router.placement.admitting import Admitter, Plan, admission_attributes, defer, refusal
from router.placement.local_prefill import LocalPrefillDecision
from router.placement.observed import Observed
from router.placement.placing import Placer

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
        self.reserver = Reserver(config, self.placer, self.observed, self.departer)
        self.prefiller = Prefiller(pool, clients, config, self.placer, self.observed, self.reserver, self._blame)
        self.decoder = Decoder(pool, config, self.departer, self._blame)
        self.aborts = FleetAborts(pool, clients)  # Aborts of requests another router runs
        self.reattacher = Reattacher(pool, clients, config.recovery)  # streams continued from another router

    async def run(self, job: Job, outlet: Outlet | None = None) -> AsyncIterator[FlowEvent]:
        """The request's events to its end. `outlet`: what the caller does with each yielded event,
        done directly for relayed tokens as they come (router/flow/decoding.py): those are not yielded."""
        state = FlowState(RequestProtocol(job.request_id), outlet=outlet)
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
                finally:
                    self.placer.release(state)  # a choice its attempt never opened a call on
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
        started: Started | None = None
        try:
            if departed is None and not local and self.config.reserve_at is ReserveAt.PREFILL:
                prefill = await self.placer.prefill(job, state, decode, plan.prefill)
                plan = dataclasses.replace(plan, prefill=prefill)
                if prefill.target_follows:  # the prompt starts there first; the decode worker reserves after
                    state.protocol.advance(Signal.PLACED_LATE, decode.address)
                    async for event in self.prefiller.start(job, state, decode, prefill):
                        if isinstance(event, Started):
                            started = event
                        else:
                            yield event
            if started is None:
                state.protocol.advance(Signal.PLACED_LOCAL if local else Signal.PLACED, decode.address)
            attempt = self._open_decode(job, state, decode, local, departed is not None)
            yield Milestone("placement", {"pdserve.decode_worker": decode.address, "pdserve.local_prefill": local,
                                          "pdserve.local_prefill.reason": MOVED_KV if departed else plan.local.reason,
                                          "pdserve.decode_cached_tokens": state.decode_cached_tokens})
            if departed is not None:
                head = self.reserver.move_kv(attempt, departed)
            elif started is not None:
                head = self.prefiller.fill(attempt, started)
            elif not local:
                head = self.prefiller.prefill(attempt, plan.prefill)
            else:
                head = _nothing()
            async for event in self.decoder.drive(attempt, head):
                yield event
        finally:
            if started is not None:
                self.prefiller.close(started)

    def _open_decode(self, job: Job, state: FlowState, decode: Worker, local: bool, moving_kv: bool) -> Attempt:
        self.placer.release(state)
        self.pool.placed(decode)
        opened = time.monotonic()
        on_worker = worker_job(job, state, self.config, moving_kv=moving_kv)
        call = Pumped(self.clients.decode(decode.address).open(on_worker, local), decode.address)
        return Attempt(job, state, decode, call, on_worker.request_id, opened)

    async def _attach(self, job: Job, state: FlowState) -> AsyncIterator[FlowEvent]:
        """The attempt a continued stream's decode worker holds (router/flow/reattaching.py), driven here."""
        held, state.attach = state.attach, None
        decode = self.pool.workers.get(held.address)
        state.protocol.advance(Signal.ATTACH, held.address)
        if decode is None:
            raise WorkerFault(FaultKind.LOST, held.address, f"{held.address} left the pool", Culprit.NOBODY)
        self.pool.placed(decode)
        on_worker = dataclasses.replace(worker_job(job, state, self.config), request_id=held.request_id)
        call = Pumped(self.clients.decode(decode.address).attach(on_worker), decode.address)
        attempt = Attempt(job, state, decode, call, held.request_id, time.monotonic())
        yield Milestone("placement", {"pdserve.decode_worker": decode.address, "pdserve.local_prefill": False,
                                      "pdserve.local_prefill.reason": ATTACHED})
        async for event in self.decoder.drive(attempt, self._attached(attempt)):
            yield event

    async def _attached(self, attempt: Attempt) -> AsyncIterator[FlowEvent]:
        """Attach's first event: the request's tokens so far, those the client lacks relayed."""
        state, call = attempt.state, attempt.call
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


async def _nothing() -> AsyncIterator[FlowEvent]:
    return
    yield


@dataclass(frozen=True)
class _Admitted:
    decode: Worker
    plan: Plan
