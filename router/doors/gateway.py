"""The public request path, door-neutral: who asks and what they may ask, the prompt's tokens,
one RequestFlow per request, and text out.

    door (gRPC servicer, HTTP API)              Gateway
      admit(metadata, source, deadline) ────▶  trace; draining? authenticated? (a Tenant)
                                                 source.sizes() within the limits (once, here),
                                                   read off the door's wire before any copy
                                                 source.ask(): the door's wire to an Ask
                                                 priority, ids, tokens off the loop
                                          ◀───  Generation
      stream(generation) ◀───────────────────── Output ... Output(finish=...), paced by the stream
                                                 interval (router/doors/pacing.py; default: as they come)
      abort(metadata, request_id) ───────────▶  the caller's request: ABORTED, ENDED, or PENDING
                                                 (a tombstone: router/doors/tombstones.py); one another
                                                 router runs, through the workers (router/doors/aborting.py)

Errors are core exceptions (pdserve/rpc/errors.py maps them to gRPC, router/doors/http/errors.py to
HTTP). A request whose door went away (its task cancelled) is cancelled in the flow, which frees
its blocks on every worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from pdserve.aborts import Owner
from pdserve.errors import DuplicateRequestError, InvalidRequestError, OverloadedError
from pdserve.engine.text_stream import TextStream
from pdserve.requests import FinishReason
from pdserve.rpc.drain import Drain
from pdserve.rpc.errors import Unauthenticated, status_of
from router.doors.aborting import abort_elsewhere
from router.doors.asks import (Ask, AskSource, ChatPrompt, Finish, Output, SampleCount, TextPrompt, TokenPrompt, Usage,
                         check_resume)
from router.doors.frontend import Frontend
from router.doors.limits import InputLimits
from router.doors.pacing import Ending, Pacer
from router.doors.stream_interval import StreamInterval
from router.doors.tenants import ANONYMOUS, Tenant, Tenants, open_tenants
from router.doors.tombstones import AbortOutcome, RecentIds, TombstoneConfig
from router.flow.flow import RequestFlow
from router.flow.flow_types import Done, Job, NewTokens, Resumed
from router.flow.samples import Samples, best
from router.telemetry import RequestTrace

Metadata = Sequence[tuple[str, str]]
MAX_ACTIVE = 1024  # requests in flight before RESOURCE_EXHAUSTED (--max-active)
TraceFactory = Callable[[Metadata], RequestTrace]


@dataclass
class Generation:
    """An admitted request: stream it once. `count`: its samples (router/flow/samples.py); `logprobs`:
    whether the caller asked for them (best_of asks for them on its own account)."""

    job: Job
    trace: RequestTrace
    count: SampleCount = field(default_factory=SampleCount)
    logprobs: bool = True

    @property
    def request_id(self) -> str:
        return self.job.request_id


class Gateway:
    def __init__(self, frontend: Frontend, flow: RequestFlow, traces: TraceFactory, drain: Drain,
                 max_active: int = MAX_ACTIVE, tenants: Tenants = open_tenants(),
                 tombstones: TombstoneConfig = TombstoneConfig(), interval: StreamInterval = StreamInterval()):
        self.frontend = frontend
        self.interval = interval
        self.flow = flow
        self.traces = traces
        self.drain = drain
        self.max_active = max_active
        self.tenants = tenants
        self.active: dict[str, _Active] = {}
        self.ended = RecentIds(tombstones)  # ids that ended lately: an Abort of one finds it ENDED
        self.tombstones = RecentIds(tombstones)  # ids aborted before their Generate came

    @property
    def inputs(self) -> InputLimits:
        return self.frontend.inputs

    async def admit(self, metadata: Metadata, source: AskSource, remaining_s: float | None) -> Generation:
        """Who asks first (nothing of the request is read before), then the request: cheap checks,
        then tokenising off the loop. A refusal raises, recorded on the request's trace."""
        trace = self.traces(metadata)
        try:
            tenant = self._caller(metadata)
            self.inputs.check(source.sizes())
            ask = source.ask()
            job = await self._job(tenant, ask, trace, remaining_s)
        except Exception as exc:
            trace.fail(exc, status_of(exc).name)
            raise
        if ask.count.ranked and job.sampling.logprobs is None:  # ranked by their tokens' log-probabilities
            return Generation(dataclasses.replace(job, sampling=dataclasses.replace(job.sampling, logprobs=0)),
                              trace, ask.count, logprobs=False)
        return Generation(job, trace, ask.count)

    async def stream(self, generation: Generation) -> AsyncIterator[Output]:
        """The request's outputs until it ends; closing this early (or cancelling the task
        reading it) cancels the request."""
        job, trace = generation.job, generation.trace
        if self.tombstones.take(job.tenant, job.request_id):  # its Abort came first
            self.ended.add(job.tenant, job.request_id)
            trace.finish(FinishReason.ABORT, 0)
            yield _last(job, Done(FinishReason.ABORT, 0, 0), 0)
            return
        samples = None
        kept: dict[int, list[Output]] = {i: [] for i in range(generation.count.drawn)}  # each sample's outputs
        pacer = Pacer(self.interval, _observer(trace, kept))
        if generation.count.drawn == 1:
            task = asyncio.ensure_future(_pump(self.flow, job, pacer))
        else:
            samples = Samples(self.flow, job, generation.count, lambda i, e: pacer.put((i, e)))
            task = asyncio.ensure_future(samples.run())
        task.add_done_callback(lambda t: t.cancelled() and pacer.put(asyncio.CancelledError()))
        mine = _Active(task, asyncio.current_task(), job.tenant)
        self.active[job.request_id] = mine
        try:
            outputs = (self._outputs(job, pacer, trace) if samples is None
                       else self._sample_outputs(generation, samples, pacer, kept))
            async for output in outputs:
                yield output
        except BaseException as exc:
            trace.fail(exc, status_of(exc).name if isinstance(exc, Exception) else "CANCELLED")
            raise
        finally:
            task.cancel()
            if self.active.get(job.request_id) is mine:
                del self.active[job.request_id]
                self.ended.add(job.tenant, job.request_id)

    async def abort(self, metadata: Metadata, request_id: str) -> AbortOutcome:
        """The caller's request of that id aborted (ABORTED), here or through the workers (another
        router runs it: router/doors/aborting.py), found ended (ENDED), or not seen yet: then its
        Generate, arriving within the tombstones' time at any router, ends at once (PENDING)."""
        tenant = self._tenant(metadata).name
        running = self.active.get(request_id)
        if running is not None and running.tenant == tenant:
            if running.ending:
                return AbortOutcome.ENDED
            running.pump.cancel()
            return AbortOutcome.ABORTED
        return await abort_elsewhere(self.flow.aborts, Owner(tenant, request_id), self.ended, self.tombstones)

    def _caller(self, metadata: Metadata) -> Tenant:
        """Refuses while draining, and a missing or wrong bearer token."""
        self.drain.refuse_if_draining()
        return self._tenant(metadata)

    def _tenant(self, metadata: Metadata) -> Tenant:
        authorization = next((v for k, v in metadata or () if k == "authorization"), None)
        tenant = self.tenants.resolve(authorization if isinstance(authorization, str) else None)
        if tenant is None:
            raise Unauthenticated("missing or wrong bearer token")
        return tenant

    async def _job(self, tenant: Tenant, ask: Ask, trace: RequestTrace, remaining_s: float | None) -> Job:
        if (refused := check_resume(ask)) is not None:
            raise InvalidRequestError(refused)
        priority = tenant.priority_for(ask.priority)
        request_id = ask.request_id or uuid.uuid4().hex
        self._refuse_if_taken(request_id, tenant)
        prompt = await self._tokens(ask)
        self.frontend.check(prompt, ask.sampling)
        self._refuse_if_taken(request_id, tenant)  # another request may have taken it while this one tokenised
        deadline = None if remaining_s is None else time.monotonic() + remaining_s
        job = Job(request_id, tuple(prompt), ask.sampling, priority, trace.metadata(), deadline, tenant.name,
                  resume=ask.resume)
        trace.bind(job, "chat" if isinstance(ask.prompt, ChatPrompt) else "text_completion")
        return job

    async def _tokens(self, ask: Ask) -> list[int]:
        prompt = ask.prompt
        if isinstance(prompt, TextPrompt):
            return await self.frontend.text(prompt.text)
        if isinstance(prompt, TokenPrompt):
            return list(prompt.ids)
        if isinstance(prompt, ChatPrompt):
            return await self.frontend.chat(prompt.messages, prompt.tools)
        raise InvalidRequestError("no prompt: set one of text, token_ids or messages")

    def _refuse_if_taken(self, request_id: str, tenant: Tenant) -> None:
        if (running := self.active.get(request_id)) is not None and not running.ending:
            raise DuplicateRequestError(f"request_id {request_id!r} is already running")
        if len(self.active) >= self.max_active:
            raise OverloadedError(f"{self.max_active} requests are already in flight; retry later")
        cap = tenant.max_concurrent
        if cap is not None and sum(a.tenant == tenant.name for a in self.active.values()) >= cap:
            raise OverloadedError(f"tenant {tenant.name!r} has {cap} requests in flight (its max_concurrent)")

    async def _outputs(self, job: Job, pacer: Pacer, trace: RequestTrace) -> AsyncIterator[Output]:
        text = TextStream(self.frontend.tokenizer, job.prompt, job.sampling.stop)
        completion = 0
        while True:
            item = await pacer.next()
            if isinstance(item, BaseException):
                if not isinstance(item, asyncio.CancelledError):
                    raise item
                trace.finish(FinishReason.ABORT, completion)
                yield _last(job, Done(FinishReason.ABORT, 0, 0), completion)
                return
            if isinstance(item[1], Resumed):  # a continued stream: the text goes on after the client's tokens
                completion = len(item[1].prior)
                if text.push(item[1].prior).stopped:  # (its router ended it by a stop string, then died)
                    yield _last(job, Done(FinishReason.STOP, 0, 0), completion)
                    return
                continue
            output = _output_of(job, item[1], text, completion)
            if output is None:
                continue
            completion += len(output.token_ids)
            if output.finish is not None:
                trace.finish(output.finish.reason, completion)
                yield output
                return
            yield output

    async def _sample_outputs(self, generation: Generation, samples: Samples, pacer: Pacer,
                              kept: dict[int, list[Output]]) -> AsyncIterator[Output]:
        """Every sample's outputs, each tagged with its index, as they come (ranked: the n best
        samples' whole outputs once all ended, indexed in their order); `kept`: each one's so far."""
        job, trace, count = generation.job, generation.trace, generation.count
        texts = {i: TextStream(self.frontend.tokenizer, job.prompt, job.sampling.stop) for i in range(count.drawn)}
        completion = dict.fromkeys(range(count.drawn), 0)
        while kept.keys() - _ended(kept):
            item = await pacer.next()
            if isinstance(item, BaseException):  # the whole run was cancelled (an Abort)
                for i in sorted(kept.keys() - _ended(kept)):
                    kept[i].append(_last(job, Done(FinishReason.ABORT, 0, 0), completion[i], index=i))
                    if not count.ranked:
                        yield kept[i][-1]
                break
            index, event = item
            if index in _ended(kept) or event is None:
                continue
            if isinstance(event, BaseException):
                if not isinstance(event, asyncio.CancelledError):
                    raise event
                event = Done(FinishReason.ABORT, 0, 0)
            output = _output_of(job, event, texts[index], completion[index], index)
            if isinstance(event, NewTokens) and output.finish is not None:  # a stop string ended it
                samples.stop(index)
            if output is not None:
                completion[index] += len(output.token_ids)
                kept[index].append(output)
                if not count.ranked:
                    yield _without_logprobs(output, generation.logprobs)
        trace.finish(kept[0][-1].finish.reason, sum(completion.values()))
        if count.ranked:
            for rank, i in enumerate(best({i: _logprob(o) for i, o in kept.items()}, count.n)):
                for output in kept[i]:
                    yield _without_logprobs(dataclasses.replace(output, index=rank), generation.logprobs)


def _output_of(job: Job, event, text: TextStream, completion: int, index: int = 0) -> Output | None:
    """A flow event of sample `index` as its output (None: nothing for the caller); `completion`:
    its tokens before this event. A stop string in the text ends it (finish STOP) with the token
    that completed it: tokens after it are not the caller's."""
    if isinstance(event, NewTokens):
        delta = text.push(event.token_ids)
        if delta.stopped:
            return _last(job, Done(FinishReason.STOP, 0, 0), completion + delta.tokens,
                         event.token_ids[:delta.tokens], delta.text, tuple(event.logprobs[:delta.tokens]), index,
                         event.prompt_logprobs)
        return Output(tuple(event.token_ids), delta.text, tuple(event.logprobs), index=index,
                      prompt_logprobs=event.prompt_logprobs)
    if isinstance(event, Done):
        return _last(job, event, completion, text=text.finish(), index=index)
    if isinstance(event, Ending):
        output = _output_of(job, event.tokens, text, completion, index)
        if output.finish is not None:  # a stop string in its last tokens
            return output
        return _last(job, event.done, completion + len(output.token_ids), output.token_ids,
                     output.text + text.finish(), output.logprobs, index, output.prompt_logprobs)
    return None


def _ended(kept: dict[int, list[Output]]) -> set[int]:
    return {i for i, outputs in kept.items() if outputs and outputs[-1].finish is not None}


def _logprob(outputs: list[Output]) -> float:
    return sum(entry.logprob for output in outputs for entry in output.logprobs)


def _without_logprobs(output: Output, asked: bool) -> Output:
    return output if asked or not output.logprobs else dataclasses.replace(output, logprobs=())


def _last(job: Job, done: Done, completion: int, ids: Sequence[int] = (), text: str = "",
          logprobs: tuple = (), index: int = 0, prompt_logprobs: tuple = ()) -> Output:
    by_mode = done.preemptions_by_mode or {}
    usage = Usage(prompt_tokens=len(job.prompt), completion_tokens=completion, cached_tokens=done.cached_tokens,
                  preemptions=done.preemptions, recompute_preemptions=by_mode.get("recompute", 0),
                  swap_preemptions=by_mode.get("swap", 0), kv_transfer_bytes=done.kv_bytes,
                  decode_cached_tokens=done.decode_cached_tokens, local_prefill=done.local_prefill)
    return Output(tuple(ids), text, logprobs, Finish(done.reason, usage), index, prompt_logprobs)


@dataclass(frozen=True)
class _Active:
    """A request in flight: the task running its flow, and the door's task streaming it."""

    pump: asyncio.Task
    handler: asyncio.Task | None
    tenant: str = ANONYMOUS

    @property
    def ending(self) -> bool:
        """Aborted, or its client went away: a new request may take its id (the workers never
        see the two under one id: each attempt has its own there)."""
        return self.pump.cancelling() > 0 or self.pump.done() or (
            self.handler is not None and (self.handler.cancelling() > 0 or self.handler.done()))


def _observer(trace: RequestTrace, kept: dict[int, list[Output]]) -> Callable[[int, object], None]:
    """What the trace sees of a request's events as they arrive: the first sample's, until it ended."""
    if len(kept) == 1:
        return lambda _, event: trace.on_event(event)
    return lambda i, event: i == 0 and 0 not in _ended(kept) and trace.on_event(event)


async def _pump(flow: RequestFlow, job: Job, pacer: Pacer) -> None:
    """Its events as sample 0's (router/doors/pacing.py's items). Every way it ends puts a last item in
    the pacer; a task cancelled before it ran does not run this at all: the done-callback in
    stream() covers that (an Abort racing the stream)."""
    try:
        async for event in flow.run(job):
            pacer.put((0, event))
    except BaseException as exc:  # handed to the output loop, which maps it
        pacer.put(exc)
