"""DecodeWorker gRPC servicer: wire messages in and out, nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from decode_service.worker import DecodeJob, DecodeWorker
from pdserve.kv.page_groups import pages_from_wire, pages_to_wire
from pdserve.errors import InvalidRequestError
from pdserve.parallel.kv_ranks import RankEnd
from pdserve.rpc.bounds import check_id, kv_timeout
from pdserve.worker.decode_peer import target_from_pb
from pdserve.rpc.convert import finish_to_pb, logprobs_to_pb, priority_from_pb, sampling_from_pb
from pdserve.rpc.drain import Drain
from pdserve.rpc.kv_ranks import kv_ranks_to_pb
from pdserve.rpc.errors import FeedClosed, PermissionDenied, Unavailable
from pdserve.rpc.feed import fed_batches_to_pb
from pdserve.rpc.owners import owner_of
from pdserve.telemetry import extract_context, stream_span
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.events import Attached, Departed, Finished, Preempted, Reserved, Tokens
from pdserve.worker.feed import Feed, Feeds
from pdserve.worker.rpcs import CommonWorkerRpcs
from pdserve.worker.session import Session


class DecodeServicer(CommonWorkerRpcs, worker_pb2_grpc.DecodeWorkerServicer):
    role = "decode"

    def __init__(self, worker: DecodeWorker, tracer: trace.Tracer, draining: Drain, transport: str,
                 kv_address: bytes, block_size: int, block_nbytes: int, num_blocks: int,
                 kv_ranks: Sequence[RankEnd] = ()):
        """`kv_ranks`: every tensor-parallel rank's receiver (rank 0's at `kv_address`); block_nbytes is one rank's."""
        super().__init__(worker, tracer, draining, transport)
        self.feeds = Feeds()  # routers' event feeds: closed before the server stops (their streams never end alone)
        draining.on_drain(self.feeds.leave)  # its routers move their requests at once
        draining.on_stop(worker.orphans.stop)  # stopping: no router could attach an orphan any more
        draining.on_stop(lambda: self.feeds.close_all(Unavailable("this worker is stopping")))
        self.kv_ranks = kv_ranks_to_pb(kv_ranks)
        self.kv_address = kv_address
        self._receivers = frozenset({kv_address, *(rank.address for rank in kv_ranks)})  # what a piece may go to
        self.block_size = block_size
        self.block_nbytes = block_nbytes
        self.num_blocks = num_blocks

    async def Decode(self, request: wpb.DecodeRequest, context):
        self.refuse_unless_serving()
        r = request.request
        feed = self._feed(request.feed_id)
        job = DecodeJob(r.request_id, tuple(r.prompt_token_ids), sampling_from_pb(r.sampling),
                        priority_from_pb(r.priority), kv_timeout(r.kv_timeout_s), request.local_prefill,
                        tuple(r.output_token_ids), r.age_s, self.refuse_if_aborted(r), r.reattachable)
        with stream_span(
                self.tracer, "pdserve.decode", context=extract_context(context.invocation_metadata()), kind=SpanKind.SERVER,
                attributes={"gen_ai.request.id": job.request_id, "pdserve.local_prefill": job.local_prefill,
                            "pdserve.resumed_tokens": len(job.output_token_ids)}) as span:
            session = await self.worker.open(job, feed, lambda event: _trace_event(span, event))
            async for message in self._drive(session, feed, span):
                yield message

    async def Attach(self, request: wpb.AttachRequest, context):
        """Another router drives the request from here on (decode_service/orphans.py)."""
        owner = owner_of(request)
        if owner is None:
            raise InvalidRequestError("Attach names the request's owner")
        feed = self._feed(request.feed_id)
        with stream_span(
                self.tracer, "pdserve.decode.attach", context=extract_context(context.invocation_metadata()),
                kind=SpanKind.SERVER, attributes={"gen_ai.request.id": request.request_id}) as span:
            session = self.worker.orphans.attach(check_id("request_id", request.request_id), owner, feed,
                                                 lambda event: _trace_event(span, event))
            async for message in self._drive(session, feed, span):
                yield message

    async def _drive(self, session: Session, feed: Feed | None, span) -> AsyncIterator[wpb.DecodeEvent]:
        """The call that drives the request: its events (or, on a feed, `fed` and its status). The
        call breaking without an Abort (its router went away) orphans a reattachable request;
        any other end ends it here."""
        orphaned = False
        try:
            if feed is None:
                async for event in session.events():
                    yield self._event_to_pb(event)
            else:
                end = await session.fed_end()
                if isinstance(end.error, FeedClosed):
                    orphaned = self.worker.orphans.orphan(session)
                yield wpb.DecodeEvent(fed=wpb.FedEvents(events=end.events))
                if end.error is not None:
                    raise end.error
        except (asyncio.CancelledError, GeneratorExit):  # (GeneratorExit: the call ended while a message was out)
            orphaned = orphaned or self.worker.orphans.orphan(session)
            raise
        finally:
            span.set_attribute("pdserve.decode.tokens", session.tokens)
            span.set_attribute("pdserve.orphaned", orphaned)
            if not orphaned:
                self.worker.live.close(session)

    async def Find(self, request: wpb.FindRequest, context) -> wpb.FindResponse:
        owner = owner_of(request)
        if owner is None:
            raise InvalidRequestError("Find names the request's owner")
        return wpb.FindResponse(held=[wpb.HeldAttempt(request_id=h.request_id, token_ids=list(h.token_ids),
                                                      attachable=h.attachable, orphaned=h.orphaned,
                                                      attachment=h.attachment)
                                      for h in self.worker.orphans.find(owner, request.prompt_digest)])

    async def Abort(self, request: wpb.WorkerAbortRequest, context) -> wpb.WorkerAbortResponse:
        """An attempt by its id is its router's only while no other router attached it since."""
        if request.HasField("owner"):
            return await super().Abort(request, context)
        return wpb.WorkerAbortResponse(found=self.worker.orphans.abort(request.request_id, request.attachment))

    async def Events(self, request: wpb.EventsRequest, context):
        """This router's feed: its id first, then a message per batch of its requests' events."""
        feed = self.feeds.open()
        try:
            yield wpb.EventBatch(feed_id=feed.id)
            async for batch in feed.batches():
                if feed.take_leaving():
                    yield wpb.EventBatch(leaving=True)
                for message in fed_batches_to_pb(batch, self._event_to_pb, token_run if request.token_runs else None):
                    yield message
        finally:
            self.feeds.close(feed, FeedClosed("the router's event feed closed"))

    def _feed(self, feed_id: str) -> Feed | None:
        if not feed_id:
            return None
        feed = self.feeds.get(check_id("feed_id", feed_id))
        if feed is None:
            raise Unavailable(f"no event feed {feed_id!r} is open here (closed, or opened before a restart)")
        return feed

    def _event_to_pb(self, event) -> wpb.DecodeEvent:
        if isinstance(event, Tokens):
            return wpb.DecodeEvent(tokens=wpb.DecodeTokens(
                token_ids=list(event.token_ids), logprobs=[logprobs_to_pb(lp) for lp in event.logprobs],
                prompt_logprobs=[logprobs_to_pb(lp) for lp in event.prompt_logprobs]))
        if isinstance(event, Reserved):
            return wpb.DecodeEvent(reserved=wpb.KVReservation(
                transfer_id=event.transfer_id, transport=self.transport, kv_address=self.kv_address,
                block_ids=pages_to_wire(event.block_ids), block_size=self.block_size, block_nbytes=self.block_nbytes,
                decode_endpoint=self.address, kv_secret=event.secret, num_blocks=self.num_blocks,
                cached_blocks=event.cached_blocks, ranks=self.kv_ranks, identity=self.kv_identity))
        if isinstance(event, Departed):
            return wpb.DecodeEvent(departed=wpb.DecodeDeparted(generated=event.generated, kv_kept=event.kv_kept))
        if isinstance(event, Attached):
            return wpb.DecodeEvent(attached=wpb.DecodeAttached(token_ids=list(event.token_ids),
                                                               attachment=event.attachment))
        if isinstance(event, Finished):
            return wpb.DecodeEvent(finished=wpb.DecodeFinished(
                finish_reason=finish_to_pb(event.reason), cached_tokens=event.cached_tokens,
                preemptions=event.preemptions, queue_seconds=event.queue_seconds))
        assert isinstance(event, Preempted)
        return wpb.DecodeEvent(preempted=wpb.PreemptionNotice(mode=event.mode, reason=event.reason, phase=event.phase))

    def in_flight(self) -> int:
        return self.worker.in_flight()

    async def Depart(self, request: wpb.DepartRequest, context) -> wpb.DepartResponse:
        """Served while draining too: a leaving worker's requests leave this way."""
        keep = kv_timeout(request.keep_kv_s) if request.keep_kv else None
        departure = await self.worker.depart(check_id("request_id", request.request_id), keep, request.attachment)
        return wpb.DepartResponse(departed=departure.departed, generated=departure.generated, reason=departure.reason,
                                  kv_kept=departure.kv_kept)

    async def MoveKV(self, request: wpb.MoveKVRequest, context) -> wpb.MoveKVResponse:
        target = target_from_pb(request.target, self.transport, self.kv_identity)
        with self.tracer.start_as_current_span(
                "pdserve.kv.move", context=extract_context(context.invocation_metadata()), kind=SpanKind.SERVER,
                attributes={"gen_ai.request.id": request.request_id,
                            "pdserve.decode_endpoint": target.decode_endpoint}) as span:
            moved = await self.worker.move_kv(check_id("request_id", request.request_id), target)
            span.set_attributes({"pdserve.kv.bytes": moved.kv_bytes, "pdserve.kv.blocks": moved.kv_blocks,
                                 "pdserve.kv.seconds": moved.kv_seconds})
        return wpb.MoveKVResponse(kv_bytes=moved.kv_bytes, kv_blocks=moved.kv_blocks, kv_seconds=moved.kv_seconds)

    async def PushKV(self, request: wpb.KVPiece, context) -> wpb.KVPieceAck:
        self._authorize(request.transfer_id, request.kv_secret)
        if any(address not in self._receivers for address in request.kv_addresses):
            raise InvalidRequestError(f"transfer {request.transfer_id!r}: a KV address the sender means to send to "
                                      "is not one of this decode worker's receivers (a damaged reservation?)")
        self.worker.push_kv(request.transfer_id, request.seq, request.block_index, pages_from_wire(request.src_block_ids),
                            request.timeout_s, max(1, request.tensor_parallel_size))
        return wpb.KVPieceAck()

    async def CompleteKV(self, request: wpb.KVComplete, context) -> wpb.KVCompleteAck:
        self._authorize(request.transfer_id, request.kv_secret)
        await self.worker.complete_kv(request.transfer_id, request.num_pieces, request.first_token_id,
                                      tuple(request.piece_checksums))
        return wpb.KVCompleteAck()

    def _authorize(self, transfer_id: str, secret: bytes) -> None:
        check_id("transfer_id", transfer_id)
        if not self.worker.presented(transfer_id, secret):
            raise PermissionDenied(f"transfer {transfer_id!r}: wrong kv_secret (only the reservation's holder "
                                   f"may write it)")


def _trace_event(span, event) -> None:
    if isinstance(event, Preempted):
        name = {"preempted": "preemption", "resumed": "resume"}.get(event.phase, event.phase)
        span.add_event(name, {"mode": event.mode, "reason": event.reason})
    elif isinstance(event, Reserved):
        span.add_event("kv.reserved", {"blocks": len(event.block_ids)})
    elif isinstance(event, Departed):
        span.add_event("departed", {"generated": event.generated})
    elif isinstance(event, Finished):
        span.set_attributes({"pdserve.finish_reason": event.reason.value, "pdserve.preemptions": event.preemptions,
                             "pdserve.cached_tokens": event.cached_tokens})


def token_run(event) -> tuple[int, ...] | None:
    """A token event with ids alone goes as a token run (pdserve/rpc/feed.py)."""
    if type(event) is Tokens and not event.logprobs and not event.prompt_logprobs:
        return event.token_ids
    return None
