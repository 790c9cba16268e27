"""A decode worker's events for this router's requests on one stream (DecodeWorker.Events), handed
to each request's sink: a message per engine step, not one per token per request (the worker's
side: pdserve/worker/feed.py).

    RouterFeeds.of(address)    one Events call per decode worker: opened at the first request
                               there, again at the next request after it broke
    FedCall.start              the feed's id (its first message) ─▶ registered under the attempt's
                               worker id ─▶ Decode(feed_id) (or Attach(feed_id)): the request's
                               lifecycle (closing it aborts the request; its end is the request's end)
        events by the feed, in order                   ─▶ the sink (a message's token runs first:
                                                          pdserve/rpc/feed.py)
        Decode's `fed` (n events went by the feed), then its end or its status
                                                       ─▶ the sink's end or fault, once n events came
    the feed breaks (the worker died, stalled, or closed it) ─▶ GONE to every request on it, after
                               the events that came before, as a broken Decode stream
    a worker without Events (UNIMPLEMENTED) ─▶ the Decode call carries every event, as before

Every event of a request comes on one ordered channel (the feed), so nothing overtakes: the end
waits for the events the worker counted before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.events import Attached, Departed, Finished
from router.fleet.clients import FaultKind, PushCall, Sink, WorkerFault
from router.fleet.grpc_wire import decode_event, fault_of

Opener = Callable[[str], grpc.aio.UnaryStreamCall]  # the call that drives a request, given its feed id ("": none)
Abandon = Callable[[int], None]  # an Abort of the attempt, given the caller's anchor of it (its attachment)


class FeedUnsupported(Exception):
    """The worker serves no event feed (one from before them): its calls carry their events."""


@dataclass(frozen=True)
class _End:
    """A Decode stream's end (`fault` None: it ended well), held until the feed's events came."""

    fault: WorkerFault | None


class EventFeed:
    """The router's end of one decode worker's Events stream."""

    def __init__(self, stub: worker_pb2_grpc.DecodeWorkerStub, address: str):
        self.address = address
        self.broken: BaseException | None = None  # why it broke
        self.unsupported = False
        self._calls: dict[str, FedCall] = {}  # worker request id -> its call
        self._id: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._id.add_done_callback(lambda f: f.cancelled() or f.exception())  # read, whoever waits
        self._call = stub.Events(wpb.EventsRequest(token_runs=True))
        self._task = asyncio.ensure_future(self._read())

    async def ready(self) -> str:
        """The feed's id, once the worker said it. WorkerFault: it broke first; FeedUnsupported."""
        return await asyncio.shield(self._id)

    def register(self, worker_id: str, call: FedCall) -> None:
        """`call` gets the events of `worker_id` from now on; raises why the feed broke, if it did."""
        if self.broken is not None:
            raise self.broken
        self._calls[worker_id] = call

    def unregister(self, worker_id: str, call: FedCall) -> None:
        if self._calls.get(worker_id) is call:
            del self._calls[worker_id]

    def close(self) -> None:
        self._call.cancel()

    async def _read(self) -> None:
        fault: BaseException = WorkerFault(FaultKind.GONE, self.address, f"{self.address}: the event feed ended")
        try:
            async for batch in self._call:
                if batch.feed_id and not self._id.done():
                    self._id.set_result(batch.feed_id)
                if batch.leaving:
                    for call in list(self._calls.values()):
                        call.worker_leaving()
                if batch.run_request_ids:
                    self._runs(batch)
                for item in batch.events:
                    call = self._calls.get(item.request_id)
                    if call is not None:
                        call.fed(decode_event(item.event))
        except grpc.aio.AioRpcError as exc:
            unsupported = exc.code() == grpc.StatusCode.UNIMPLEMENTED and not self._id.done()
            fault = FeedUnsupported(exc.details() or "") if unsupported else fault_of(exc, self.address)
            self.unsupported = unsupported
        except WorkerFault as bad:  # a message this router cannot read: the feed is of no use
            fault = bad
            self._call.cancel()
        finally:
            self._break(fault)

    def _runs(self, batch: wpb.EventBatch) -> None:
        """A message's token runs (pdserve/rpc/feed.py), each a Tokens event of its request."""
        tokens = tuple(batch.run_token_ids)
        lengths = batch.run_lengths
        if len(lengths) != len(batch.run_request_ids) or sum(lengths) != len(tokens):
            raise WorkerFault(FaultKind.FAILED, self.address, f"{self.address}: an event feed message's token "
                              f"runs do not add up ({len(batch.run_request_ids)} requests, {len(lengths)} lengths, "
                              f"{len(tokens)} tokens)")
        at = 0
        for request_id, length in zip(batch.run_request_ids, lengths):
            call = self._calls.get(request_id)
            if call is not None:
                call.fed_tokens(tokens[at:at + length])
            at += length

    def _break(self, fault: BaseException) -> None:
        self.broken = fault
        if not self._id.done():
            self._id.set_exception(fault)
        calls, self._calls = self._calls, {}
        if isinstance(fault, WorkerFault):
            for call in calls.values():
                call.feed_broke(fault)


class RouterFeeds:
    """This router's event feed to each decode worker."""

    def __init__(self) -> None:
        self._feeds: dict[str, EventFeed] = {}

    def of(self, address: str, stub: worker_pb2_grpc.DecodeWorkerStub) -> EventFeed:
        """The worker's feed: the open one, or a new one where it broke (a worker found without
        feeds keeps its broken one: its calls go without)."""
        feed = self._feeds.get(address)
        if feed is None or (feed.broken is not None and not feed.unsupported):
            feed = self._feeds[address] = EventFeed(stub, address)
        return feed

    def get(self, address: str) -> EventFeed | None:
        """The worker's feed as it is (open, broken or none), opening nothing."""
        return self._feeds.get(address)

    def forget(self, address: str) -> None:
        feed = self._feeds.pop(address, None)
        if feed is not None:
            feed.close()


class Anchor:
    """What a decode call saw of its request's end: whether closing it must end the request with
    an Abort (`abandon`: a reattachable attempt, ended on purpose only so) or the request ended."""

    def __init__(self, abandon: Abandon | None):
        self._abandon = abandon
        self.attachment = 0  # its Attached's (0: a Decode call)
        self.over = False  # Finished or Departed came, or the call ended: nothing is left to end

    def saw(self, event: object) -> None:
        if isinstance(event, Attached):
            self.attachment = event.attachment
        elif isinstance(event, (Finished, Departed)):
            self.over = True

    def let_go(self) -> None:
        """The caller closes the call: an Abort first, unless the request is over."""
        if self._abandon is not None and not self.over:
            self.over = True
            self._abandon(self.attachment)


class FedCall(PushCall):
    """One Decode (or Attach) call whose events come by its worker's event feed."""

    def __init__(self, feed: EventFeed, worker_id: str, open_call: Opener, abandon: Abandon | None = None):
        self._feed = feed
        self._worker_id = worker_id
        self._open = open_call
        self._anchor = Anchor(abandon)
        self._sink: Sink | None = None
        self._task: asyncio.Future | None = None
        self._call: grpc.aio.UnaryStreamCall | None = None
        self._received = 0  # events that came by the feed
        self._expected: int | None = None  # what the Decode stream's `fed` said went by the feed
        self._ending: _End | None = None  # the Decode stream's end, held for the feed's events
        self._done = False  # the sink got its end or fault (or the call was closed)

    def start(self, sink: Sink) -> None:
        self._sink = sink
        self._task = asyncio.ensure_future(self._run())

    def close(self) -> None:
        self._anchor.let_go()
        self._done = True
        self._feed.unregister(self._worker_id, self)
        if self._task is not None:
            self._task.cancel()
        if self._call is not None:
            self._call.cancel()

    def fed(self, event: object) -> None:
        """An event of this request by the feed."""
        if self._done:
            return
        self._anchor.saw(event)
        self._sink.deliver(event)
        self._counted()

    def fed_tokens(self, token_ids: tuple[int, ...]) -> None:
        """A token event of ids alone (a run) of this request by the feed."""
        if self._done:
            return
        self._sink.deliver_tokens(token_ids)
        self._counted()

    def worker_leaving(self) -> None:
        """Its worker said by the feed that it leaves (not an event of the request: not counted)."""
        if not self._done:
            self._sink.worker_leaving()

    def _counted(self) -> None:
        """One more event came by the feed: the held end goes on once all it counted came."""
        self._received += 1
        if self._ending is not None and self._received >= (self._expected or 0):
            self._finish(self._ending.fault)

    def feed_broke(self, fault: WorkerFault) -> None:
        if not self._done:
            self._finish(fault)

    async def _run(self) -> None:
        feed_id = ""
        try:
            feed_id = await self._feed.ready()
            self._feed.register(self._worker_id, self)
        except FeedUnsupported:
            pass
        except WorkerFault as fault:
            self._finish(fault)
            return
        self._call = self._open(feed_id)
        try:
            async for message in self._call:
                if message.WhichOneof("event") == "fed":
                    self._expected = message.fed.events
                elif not self._done:
                    event = decode_event(message)
                    self._anchor.saw(event)
                    self._sink.deliver(event)
            self._anchor.over = True
            self._ended(None)
        except grpc.aio.AioRpcError as exc:
            self._ended(fault_of(exc, self._feed.address))

    def _ended(self, fault: WorkerFault | None) -> None:
        """The Decode stream ended: pass it on once the events counted before it came by the feed."""
        if self._received >= (self._expected or 0):
            self._finish(fault)
        else:
            self._ending = _End(fault)

    def _finish(self, fault: WorkerFault | None) -> None:
        if self._done:
            return
        self._done = True
        self._feed.unregister(self._worker_id, self)
        if fault is None:
            self._sink.end()
        else:
            self._sink.fail(fault)
