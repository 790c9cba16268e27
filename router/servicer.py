"""The public Generation service: wire in, RequestFlow, wire out. Text happens here."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.engine.errors import DuplicateRequestError, InvalidRequestError, OverloadedError
from pdserve.engine.text_stream import TextStream
from pdserve.requests import FinishReason
from pdserve.rpc.drain import Drain
from pdserve.rpc.convert import finish_to_pb, priority_from_pb, sampling_from_pb
from pdserve.rpc.errors import Unauthenticated, status_of
from pdserve.tokenizer import ChatMessage
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc
from router.flow import Done, Job, NewTokens, RequestFlow
from router.frontend import Frontend
from router.telemetry import RequestTrace
from router.tenants import ANONYMOUS, Tenant, Tenants, open_tenants

TraceFactory = Callable[[object], RequestTrace]


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, frontend: Frontend, flow: RequestFlow, traces: TraceFactory, drain: Drain,
                 max_active: int = 1024, tenants: Tenants = open_tenants()):
        self.drain = drain
        self.tenants = tenants
        self.frontend = frontend
        self.flow = flow
        self.traces = traces
        self.max_active = max_active
        self.active: dict[str, _Active] = {}

    async def Generate(self, request: pb.GenerateRequest, context):
        trace = self.traces(context.invocation_metadata())
        try:
            job = await self._admit(request, trace, context.time_remaining(), context.invocation_metadata())
        except Exception as exc:
            trace.fail(exc, status_of(exc).name)
            raise
        events: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(_pump(self.flow, job, events))
        task.add_done_callback(lambda t: t.cancelled() and events.put_nowait(asyncio.CancelledError()))
        mine = _Active(task, asyncio.current_task(), job.tenant)
        self.active[job.request_id] = mine
        try:
            async for message in self._responses(job, events, trace):
                yield message
        except BaseException as exc:
            trace.fail(exc, status_of(exc).name if isinstance(exc, Exception) else "CANCELLED")
            raise
        finally:
            task.cancel()
            if self.active.get(job.request_id) is mine:
                del self.active[job.request_id]

    async def _admit(self, request: pb.GenerateRequest, trace: RequestTrace, remaining_s: float | None,
                     metadata=()) -> Job:
        """Cheap checks first (who asks, sizes straight off the message), then tokenising off the loop."""
        self.drain.refuse_if_draining()
        tenant = self._tenant(metadata)
        priority = tenant.priority_for(priority_from_pb(request.priority))
        request_id = request.request_id or uuid.uuid4().hex
        self.frontend.inputs.check_request_id(request_id)
        self._refuse_if_taken(request_id, tenant)
        self.frontend.inputs.check_stops(request.sampling.stop, len(request.sampling.stop_token_ids))
        prompt = await self._prompt(request)
        sampling = sampling_from_pb(request.sampling)
        self.frontend.check(prompt, sampling)
        self._refuse_if_taken(request_id, tenant)  # another request may have taken it while this one tokenised
        deadline = None if remaining_s is None else time.monotonic() + remaining_s
        job = Job(request_id, tuple(prompt), sampling, priority, trace.metadata(), deadline, tenant.name)
        trace.bind(job)
        return job

    def _tenant(self, metadata) -> Tenant:
        authorization = next((v for k, v in metadata or () if k == "authorization"), None)
        tenant = self.tenants.resolve(authorization if isinstance(authorization, str) else None)
        if tenant is None:
            raise Unauthenticated("missing or wrong bearer token")
        return tenant

    def _refuse_if_taken(self, request_id: str, tenant: Tenant) -> None:
        if (running := self.active.get(request_id)) is not None and not running.ending:
            raise DuplicateRequestError(f"request_id {request_id!r} is already running")
        if len(self.active) >= self.max_active:
            raise OverloadedError(f"{self.max_active} requests are already in flight; retry later")
        cap = tenant.max_concurrent
        if cap is not None and sum(a.tenant == tenant.name for a in self.active.values()) >= cap:
            raise OverloadedError(f"tenant {tenant.name!r} has {cap} requests in flight (its max_concurrent)")

    async def _responses(self, job: Job, events: asyncio.Queue, trace: RequestTrace):
        text = TextStream(self.frontend.tokenizer, job.prompt, job.sampling.stop)
        completion = 0
        while True:
            event = await events.get()
            if isinstance(event, BaseException):
                if not isinstance(event, asyncio.CancelledError):
                    raise event
                trace.finish(FinishReason.ABORT, completion)
                yield self._last(job, [], "", FinishReason.ABORT, completion, 0, 0)
                return
            trace.on_event(event)
            if isinstance(event, NewTokens):
                completion += len(event.token_ids)
                delta = text.push(event.token_ids)
                if delta.stopped:
                    trace.finish(FinishReason.STOP, completion)
                    yield self._last(job, event.token_ids, delta.text, FinishReason.STOP, completion, 0, 0)
                    return
                yield pb.GenerateResponse(request_id=job.request_id, token_ids=list(event.token_ids), text=delta.text)
            elif isinstance(event, Done):
                trace.finish(event.reason, completion)
                yield self._last(job, [], text.finish(), event.reason, completion, event.cached_tokens,
                                 event.preemptions, event.preemptions_by_mode)
                return

    def _last(self, job: Job, ids, text: str, reason: FinishReason, completion: int, cached: int, preemptions: int,
              by_mode: dict | None = None):
        by_mode = by_mode or {}
        usage = pb.Usage(prompt_tokens=len(job.prompt), cached_tokens=cached, completion_tokens=completion,
                         preemptions=preemptions, recompute_preemptions=by_mode.get("recompute", 0),
                         swap_preemptions=by_mode.get("swap", 0))
        return pb.GenerateResponse(request_id=job.request_id, token_ids=list(ids), text=text,
                                   finish_reason=finish_to_pb(reason), usage=usage)

    async def _prompt(self, request: pb.GenerateRequest) -> list[int]:
        kind = request.WhichOneof("prompt")
        if kind == "text":
            return await self.frontend.text(request.text)
        if kind == "token_ids":
            self.frontend.inputs.check_token_ids(len(request.token_ids.ids))
            return list(request.token_ids.ids)
        if kind == "messages":
            self.frontend.inputs.check_messages(len(request.messages.messages))
            return await self.frontend.chat([ChatMessage(m.role, m.content) for m in request.messages.messages])
        raise InvalidRequestError("no prompt: set one of text, token_ids or messages")

    async def Abort(self, request: pb.AbortRequest, context) -> pb.AbortResponse:
        running = self.active.get(request.request_id)
        if running is None or running.ending:
            return pb.AbortResponse(found=False)
        running.pump.cancel()
        return pb.AbortResponse(found=True)


@dataclass(frozen=True)
class _Active:
    """A request in flight: the task running its flow, and the Generate handler streaming it."""

    pump: asyncio.Task
    handler: asyncio.Task | None
    tenant: str = ANONYMOUS

    @property
    def ending(self) -> bool:
        """Aborted, or its client went away: a new request may take its id (the workers never
        see the two under one id: each attempt has its own there)."""
        return self.pump.cancelling() > 0 or self.pump.done() or (
            self.handler is not None and (self.handler.cancelling() > 0 or self.handler.done()))


async def _pump(flow: RequestFlow, job: Job, events: asyncio.Queue) -> None:
    """Every way it ends puts a last item on `events`; a task cancelled before it ran does not
    run this at all: the done-callback in Generate covers that (an Abort racing the Generate)."""
    try:
        async for event in flow.run(job):
            events.put_nowait(event)
    except BaseException as exc:  # handed to the response loop, which maps it
        events.put_nowait(exc)
