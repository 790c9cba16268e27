"""PrefillWorker gRPC servicer, and the client side of its calls to decode workers."""

from __future__ import annotations

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from pdserve.errors import InvalidRequestError, PeerFault
from pdserve.rpc.bounds import check_address, check_id, check_kv_address, kv_timeout
from pdserve.rpc.channels import ChannelPool
from pdserve.rpc.convert import logprobs_to_pb, priority_from_pb, sampling_from_pb
from pdserve.rpc.kv_ranks import kv_ranks_from_pb
from pdserve.rpc.drain import Drain
from pdserve.telemetry import Metrics, extract_context, stream_span
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.events import Chunk, FirstToken
from pdserve.worker.rpcs import CommonWorkerRpcs
from prefill_service.worker import DecodePeer, Piece, PrefillWorker, Target


class GrpcDecodePeer(DecodePeer):
    def __init__(self, channels: ChannelPool):
        self.channels = channels

    def _stub(self, endpoint: str) -> worker_pb2_grpc.DecodeWorkerStub:
        return worker_pb2_grpc.DecodeWorkerStub(self.channels.get(endpoint))

    async def push_kv(self, endpoint: str, piece: Piece) -> None:
        message = wpb.KVPiece(transfer_id=piece.transfer_id, seq=piece.seq, block_index=piece.block_index,
                              src_block_ids=list(piece.src_block_ids), timeout_s=piece.timeout_s,
                              kv_secret=piece.secret, tensor_parallel_size=piece.senders if piece.senders > 1 else 0)
        try:
            await self._stub(endpoint).PushKV(message, timeout=piece.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _peer_fault("PushKV", endpoint, exc) from None

    async def complete_kv(self, endpoint: str, transfer_id: str, num_pieces: int, first_token: int,
                          secret: bytes) -> None:
        message = wpb.KVComplete(transfer_id=transfer_id, num_pieces=num_pieces, first_token_id=first_token,
                                 kv_secret=secret)
        try:
            await self._stub(endpoint).CompleteKV(message, timeout=60.0)
        except grpc.aio.AioRpcError as exc:
            raise _peer_fault("CompleteKV", endpoint, exc) from None


def _peer_fault(method: str, endpoint: str, exc: grpc.aio.AioRpcError) -> PeerFault:
    return PeerFault(f"{method} on decode worker {endpoint}: {exc.code().name}: {exc.details() or ''}")


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
        target = self._target_from_pb(t)
        with stream_span(
                self.tracer, "pdserve.prefill", context=extract_context(context.invocation_metadata()), kind=SpanKind.SERVER,
                attributes={"gen_ai.request.id": r.request_id, "pdserve.prompt_tokens": len(r.prompt_token_ids),
                            "pdserve.resumed_tokens": len(r.output_token_ids),
                            "pdserve.decode_endpoint": t.decode_endpoint}) as span:
            session = await self.worker.open(r.request_id, tuple(r.prompt_token_ids), sampling_from_pb(r.sampling),
                                             priority_from_pb(r.priority), target, kv_timeout(r.kv_timeout_s),
                                             tuple(r.output_token_ids), r.age_s)
            try:
                async for event in session.events():
                    self._observe(span, event)
                    yield _event_to_pb(event)
            finally:
                self.worker.live.close(session)

    def _target_from_pb(self, t: wpb.KVReservation) -> Target:
        """The reservation's addresses and transport checked here; its layout by the worker."""
        if t.transport != self.transport:
            raise InvalidRequestError(f"reservation over transport {t.transport[:32]!r}; this worker sends over "
                                      f"{self.transport!r}")
        return Target(check_id("transfer_id", t.transfer_id), check_kv_address(t.kv_address), tuple(t.block_ids),
                      t.block_size, t.block_nbytes, check_address("decode_endpoint", t.decode_endpoint),
                      t.kv_secret, t.num_blocks, t.cached_blocks, kv_ranks_from_pb(t.ranks))

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
        queue_seconds=event.queue_seconds)
    if event.logprobs is not None:
        done.first_token_logprobs.CopyFrom(logprobs_to_pb(event.logprobs))
    return wpb.PrefillEvent(done=done)
