"""PrefillWorker gRPC servicer: wire messages in and out, nothing else (its calls to decode workers: pdserve/worker/decode_peer.py)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from pdserve.rpc.bounds import kv_timeout
from pdserve.worker.decode_peer import target_from_pb
from pdserve.rpc.convert import logprobs_to_pb, priority_from_pb, sampling_from_pb
from pdserve.rpc.drain import Drain
from pdserve.telemetry import Metrics, extract_context, stream_span
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.events import Chunk, FirstToken
from pdserve.worker.rpcs import CommonWorkerRpcs
from prefill_service.worker import PrefillWorker


class PrefillServicer(CommonWorkerRpcs, worker_pb2_grpc.PrefillWorkerServicer):
    """`transport`: the only kind of reservation this worker's sender can fill."""

    role = "prefill"

    def __init__(self, worker: PrefillWorker, tracer: trace.Tracer, metrics: Metrics, draining: Drain,
                 transport: str):
        super().__init__(worker, tracer, draining, transport)
        self.metrics = metrics

    async def Prefill(self, request: wpb.PrefillRequest, context):
        self.refuse_unless_serving()
        r, t = request.request, request.target
        target = None if request.target_follows else target_from_pb(t, self.transport, self.kv_identity)
        owner = self.refuse_if_aborted(r)
        with stream_span(
                self.tracer, "pdserve.prefill", context=extract_context(context.invocation_metadata()), kind=SpanKind.SERVER,
                attributes={"gen_ai.request.id": r.request_id, "pdserve.prompt_tokens": len(r.prompt_token_ids),
                            "pdserve.resumed_tokens": len(r.output_token_ids),
                            "pdserve.decode_endpoint": t.decode_endpoint,
                            "pdserve.target_follows": request.target_follows}) as span:
            session = await self.worker.open(r.request_id, tuple(r.prompt_token_ids), sampling_from_pb(r.sampling),
                                             priority_from_pb(r.priority), target, kv_timeout(r.kv_timeout_s),
                                             tuple(r.output_token_ids), r.age_s, owner)
            try:
                async for event in session.events():
                    self._observe(span, event)
                    yield _event_to_pb(event)
            finally:
                self.worker.live.close(session)

    async def Stats(self, request: wpb.StatsRequest, context) -> wpb.WorkerStats:
        stats = await super().Stats(request, context)
        stats.target_follows = True
        stats.requests_awaiting_target = self.worker.awaiting_target()
        return stats

    async def SetTarget(self, request: wpb.SetTargetRequest, context) -> wpb.SetTargetResponse:
        target = target_from_pb(request.target, self.transport, self.kv_identity)
        return wpb.SetTargetResponse(held_blocks=self.worker.set_target(request.request_id, target))

    def _observe(self, span, event) -> None:
        if isinstance(event, Chunk):
            span.add_event("prefill.chunk", {"start": event.start, "tokens": event.num_tokens,
                                             "cached_tokens": event.cached_tokens, "step_seconds": event.step_seconds})
            return
        span.set_attributes({"pdserve.kv.bytes": event.kv_bytes, "pdserve.kv.blocks": event.kv_blocks,
                             "pdserve.kv.descriptors": event.kv_descriptors, "pdserve.kv.seconds": event.kv_seconds,
                             "pdserve.cached_tokens": event.cached_tokens})
        self.metrics.observe_kv_transfer(event.kv_seconds, event.kv_bytes)


def _event_to_pb(event) -> wpb.PrefillEvent:
    if isinstance(event, Chunk):
        return wpb.PrefillEvent(chunk=wpb.PrefillChunk(start=event.start, num_tokens=event.num_tokens,
                                                       cached_tokens=event.cached_tokens,
                                                       step_seconds=event.step_seconds))
    assert isinstance(event, FirstToken)
    done = wpb.PrefillDone(
        first_token_id=event.token_id, cached_tokens=event.cached_tokens, kv_bytes=event.kv_bytes,
        kv_blocks=event.kv_blocks, kv_descriptors=event.kv_descriptors, kv_seconds=event.kv_seconds,
        queue_seconds=event.queue_seconds, prompt_logprobs=[logprobs_to_pb(lp) for lp in event.prompt_logprobs])
    if event.logprobs is not None:
        done.first_token_logprobs.CopyFrom(logprobs_to_pb(event.logprobs))
    return wpb.PrefillEvent(done=done)
