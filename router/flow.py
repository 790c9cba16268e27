"""One request's path through the workers, as the router drives it.

    choose decode D --Decode--> Reserved(blocks)            (colocated/resume: D prefills itself)
    choose prefill P --Prefill(reservation)--> chunks ... PrefillDone(first token)  -> client
    D streams the following tokens -> client, until Finished
    P fails before its first token: retry on another P (a fresh reservation on D)
    D fails mid-stream: resume on another D with prompt + tokens so far (or fail: UNAVAILABLE)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc

from pdserve.requests import FinishReason, Priority, SamplingParams
from pdserve.rpc.convert import finish_from_pb, priority_to_pb, sampling_to_pb
from pdserve.rpc.errors import Unavailable
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from router.placement import NoWorker, choose_decode, choose_prefill
from router.workers import WorkerPool

log = logging.getLogger(__name__)
# A worker that failed or went away; DEADLINE_EXCEEDED is the client's own deadline: never retried.
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
             grpc.StatusCode.INTERNAL)


@dataclass(frozen=True)
class Job:
    request_id: str
    prompt: tuple[int, ...]
    sampling: SamplingParams
    priority: Priority
    metadata: tuple[tuple[str, str], ...] = ()
    deadline: float | None = None  # time.monotonic() at which the client stops waiting

    def timeout_s(self) -> float | None:
        """What is left of the client's deadline, for the calls made on its behalf."""
        return None if self.deadline is None else max(0.001, self.deadline - time.monotonic())


@dataclass(frozen=True)
class NewTokens:
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Done:
    reason: FinishReason
    cached_tokens: int
    preemptions: int
    preemptions_by_mode: dict = field(default_factory=dict)  # "recompute" | "swap" -> count


@dataclass(frozen=True)
class Milestone:
    """Something for the trace: placement, prefill chunk, KV transfer, preemption."""

    name: str
    attributes: dict


FlowEvent = NewTokens | Done | Milestone


@dataclass
class FlowState:
    attempt: int = 0
    generated: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    preemptions: int = 0
    by_mode: dict[str, int] = field(default_factory=dict)
    excluded_prefill: set[str] = field(default_factory=set)
    excluded_decode: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class FlowConfig:
    colocated: bool = False
    resume_on_decode_failure: bool = True
    kv_timeout_s: float = 30.0
    max_attempts: int = 4


class RequestFlow:
    def __init__(self, pool: WorkerPool, config: FlowConfig):
        self.pool = pool
        self.config = config

    async def run(self, job: Job) -> AsyncIterator[FlowEvent]:
        state = FlowState()
        for attempt in range(self.config.max_attempts):
            state.attempt = attempt
            decode = self._pick_decode(state)
            try:
                async for event in self._attempt(job, state, decode):
                    yield event
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE:
                    raise
                if not self._may_retry(state):
                    raise Unavailable(f"the decode worker serving {job.request_id} failed "
                                      f"({exc.code().name}: {exc.details()})") from exc
                log.warning("request %s attempt %d failed (%s): retrying", job.request_id, attempt, exc.code())
        raise Unavailable(f"request {job.request_id} failed after {self.config.max_attempts} attempts")

    def _may_retry(self, state: FlowState) -> bool:
        return not state.generated or self.config.resume_on_decode_failure

    def _pick_decode(self, state: FlowState):
        try:
            return choose_decode(self.pool.of_role("decode"), state.excluded_decode)
        except NoWorker as exc:
            raise Unavailable(str(exc)) from None

    async def _attempt(self, job: Job, state: FlowState, decode) -> AsyncIterator[FlowEvent]:
        local = self.config.colocated or bool(state.generated)
        stub = worker_pb2_grpc.DecodeWorkerStub(self.pool.channels.get(decode.address))
        call = stub.Decode(wpb.DecodeRequest(request=self._worker_request(job, state), local_prefill=local),
                           metadata=job.metadata, timeout=job.timeout_s())
        yield Milestone("placement", {"pdserve.decode_worker": decode.address, "pdserve.local_prefill": local})
        decode.assigned += 1
        try:
            events = call.__aiter__()
            if not local:
                async for event in self._remote_prefill(job, state, events, decode.address):
                    yield event
            async for event in self._relay(state, events):
                yield event
        except grpc.aio.AioRpcError as exc:
            if exc.code() in RETRYABLE and not _is_prefill_error(exc):
                state.excluded_decode.add(decode.address)
                self.pool.mark_failed(decode.address)
            raise
        finally:
            decode.assigned -= 1
            call.cancel()

    def _worker_request(self, job: Job, state: FlowState) -> wpb.WorkerRequest:
        """Each attempt has its own id on the workers, so a retry never meets the previous one."""
        worker_id = job.request_id if state.attempt == 0 else f"{job.request_id}@{state.attempt}"
        return wpb.WorkerRequest(request_id=worker_id, prompt_token_ids=list(job.prompt),
                                 sampling=sampling_to_pb(job.sampling), priority=priority_to_pb(job.priority),
                                 kv_timeout_s=self.config.kv_timeout_s, output_token_ids=state.generated)

    async def _remote_prefill(self, job: Job, state: FlowState, events, decode_address: str) -> AsyncIterator[FlowEvent]:
        first = await events.__anext__()
        if first.WhichOneof("event") != "reserved":
            raise Unavailable(f"decode worker {decode_address} did not reserve KV blocks")
        prefill = await self._pick_prefill(job, state)
        yield Milestone("placement.prefill", {"pdserve.prefill_worker": prefill.address,
                                              "pdserve.kv_blocks_reserved": len(first.reserved.block_ids)})
        stub = worker_pb2_grpc.PrefillWorkerStub(self.pool.channels.get(prefill.address))
        call = stub.Prefill(wpb.PrefillRequest(request=self._worker_request(job, state), target=first.reserved),
                            metadata=job.metadata, timeout=job.timeout_s())
        prefill.assigned += 1
        try:
            async for event in call:  # noqa: B007 - the loop returns at PrefillDone
                if event.WhichOneof("event") == "chunk":
                    c = event.chunk
                    yield Milestone("prefill.chunk", {"tokens": c.num_tokens, "start": c.start,
                                                      "cached_tokens": c.cached_tokens, "step_seconds": c.step_seconds})
                    continue
                done = event.done
                state.cached_tokens = done.cached_tokens
                yield Milestone("kv_transfer", {"bytes": done.kv_bytes, "blocks": done.kv_blocks,
                                                "descriptors": done.kv_descriptors, "seconds": done.kv_seconds,
                                                "queue_seconds": done.queue_seconds})
                state.generated.append(done.first_token_id)
                yield NewTokens((done.first_token_id,))
                return
        except grpc.aio.AioRpcError as exc:
            if exc.code() in RETRYABLE:
                state.excluded_prefill.add(prefill.address)
                self.pool.mark_failed(prefill.address)
                raise _PrefillFailed(exc) from exc
            raise
        finally:
            prefill.assigned -= 1
            call.cancel()
        raise Unavailable(f"prefill worker {prefill.address} ended without a first token")

    async def _pick_prefill(self, job: Job, state: FlowState):
        workers = self.pool.of_role("prefill")
        cached = await self._cached_prefixes(job.prompt, [w.address for w in workers if w.address not in state.excluded_prefill])
        try:
            return choose_prefill(workers, cached, state.excluded_prefill)
        except NoWorker as exc:
            raise Unavailable(str(exc)) from None

    async def _cached_prefixes(self, prompt: Sequence[int], addresses: list[str]) -> dict[str, int]:
        if len(addresses) < 2:
            return {}

        async def probe(address: str) -> int:
            stub = worker_pb2_grpc.PrefillWorkerStub(self.pool.channels.get(address))
            try:
                return (await stub.MatchPrefix(wpb.MatchPrefixRequest(token_ids=list(prompt)), timeout=1.0)).cached_tokens
            except grpc.aio.AioRpcError:
                return -1

        counts = await asyncio.gather(*(probe(a) for a in addresses))
        return dict(zip(addresses, counts))

    async def _relay(self, state: FlowState, events) -> AsyncIterator[FlowEvent]:
        async for event in events:
            kind = event.WhichOneof("event")
            if kind == "tokens":
                state.generated.extend(event.tokens.token_ids)
                yield NewTokens(tuple(event.tokens.token_ids))
            elif kind == "preempted":
                p = event.preempted
                if p.phase == "preempted":
                    state.by_mode[p.mode] = state.by_mode.get(p.mode, 0) + 1
                yield Milestone(f"decode.{p.phase}", {"mode": p.mode, "reason": p.reason})
            elif kind == "finished":
                f = event.finished
                state.preemptions += f.preemptions
                cached = state.cached_tokens or f.cached_tokens
                yield Done(finish_from_pb(f.finish_reason), cached, state.preemptions, dict(state.by_mode))
                return
        raise Unavailable("the decode worker ended the stream without finishing the request")


class _PrefillFailed(grpc.aio.AioRpcError):
    """A prefill worker failed: retry with a fresh reservation, the decode worker is fine."""

    def __init__(self, cause: grpc.aio.AioRpcError):
        super().__init__(cause.code(), cause.initial_metadata(), cause.trailing_metadata(), cause.details(),
                         cause.debug_error_string())


def _is_prefill_error(exc: grpc.aio.AioRpcError) -> bool:
    return isinstance(exc, _PrefillFailed)
