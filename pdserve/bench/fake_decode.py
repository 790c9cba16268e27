"""The fake decode worker's servicer (pdserve/bench/fake_workers.py): DecodeWorker with no model,
stepping as an engine does.

    Decode      a stream of `max_tokens` words, paced as its request id says; its first token at
                once, the rest at the first step at or after each one's time
    the clock   a step every `step_s` while streams run: each stream's tokens due by then as one
                event (a real worker's step gives each request its token together)
    Events      a router's feed: a step's events of every stream that named it, as one EventBatch
                (a stream's events waiting while the router reads are joined; its tokens as runs
                where the router asked: pdserve/rpc/feed.py); such a stream's Decode call sends
                `fed` (how many went by the feed) and ends with it
    Stats       ready, the embedded model's identity, its streams as running requests

Each stream's send times (CLOCK_MONOTONIC ns, as its tokens are handed to gRPC) go to the send
log as it ends, ended or cancelled.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from pdserve.v1 import generation_pb2 as gpb
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc

BLOCKS = 1 << 20  # what Stats says it has free: placement and admission never wait for blocks
DEFAULT_MAX_TOKENS = 256  # a request without max_tokens (the router always sets it)
FINISHED = wpb.DecodeEvent(finished=wpb.DecodeFinished(finish_reason=gpb.FINISH_REASON_LENGTH))


@dataclass(eq=False)
class _Stream:
    worker_id: str
    start: float
    interval_s: float
    total: int
    feed: _Feed | None
    emitted: int = 0  # tokens given out by steps
    due: list[int] = field(default_factory=list)  # indices given out, not sent yet
    sent: list[int] = field(default_factory=list)  # CLOCK_MONOTONIC ns of each token sent
    fed: int = 0  # events sent by the feed
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # a step gave it tokens, or it ended
    ended: bool = False  # its Finished was given out
    finish_sent: bool = False  # ... and sent by its feed

    def step(self, now: float) -> bool:
        """Gives out the tokens due by `now` (and the end after the last); whether anything."""
        before = self.emitted
        while self.emitted < self.total and self.start + self.emitted * self.interval_s <= now:
            self.due.append(self.emitted)
            self.emitted += 1
        if self.emitted >= self.total and not self.ended:
            self.ended = True
            return True
        return self.emitted > before


class _Feed:
    def __init__(self) -> None:
        self.id = secrets.token_hex(8)
        self.streams: dict[_Stream, None] = {}  # with something to send, in order
        self.attached: set[_Stream] = set()  # every stream that named it, until it ends
        self.wake = asyncio.Event()
        self.closed = False


class FakeDecodeServicer(worker_pb2_grpc.DecodeWorkerServicer):
    def __init__(self, token_ids: tuple[int, ...], identity: wpb.WorkerIdentity, log: Callable[[str, list[int]], None],
                 interval_s: float, step_s: float, name_of: Callable[[str], str],
                 interval_of: Callable[[str, float], float]):
        """`log(name, sent)`: a stream's send times as it ends; `name_of`: the client's id in a
        worker id; `interval_of(name, default)`: the pace it asks for."""
        self._tokens = token_ids
        self._identity = identity
        self._log = log
        self._interval_s = interval_s
        self._step_s = step_s
        self._name_of = name_of
        self._interval_of = interval_of
        self._streams: dict[_Stream, None] = {}
        self._feeds: dict[str, _Feed] = {}
        self._clock: asyncio.Task | None = None

    @property
    def running(self) -> int:
        return len(self._streams)

    async def Decode(self, request: wpb.DecodeRequest, context):
        if not request.local_prefill:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "the fake decode worker only prefills locally: run the router with --colocated")
        feed = self._feeds.get(request.feed_id) if request.feed_id else None
        if request.feed_id and feed is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"no event feed {request.feed_id!r} here")
        r = request.request
        name = self._name_of(r.request_id)
        stream = _Stream(r.request_id, time.monotonic(), self._interval_of(name, self._interval_s),
                         r.sampling.max_tokens or DEFAULT_MAX_TOKENS, feed)
        self._streams[stream] = None
        if feed is not None:
            feed.attached.add(stream)
        self._given(stream, time.monotonic())  # its first token at once
        if self._clock is None or self._clock.done():
            self._clock = asyncio.ensure_future(self._run_clock())
        try:
            while True:
                await stream.wake.wait()
                stream.wake.clear()
                if feed is not None:
                    if feed.closed:
                        await context.abort(grpc.StatusCode.UNAVAILABLE, "its event feed closed")
                    if stream.finish_sent:
                        yield wpb.DecodeEvent(fed=wpb.FedEvents(events=stream.fed))
                        return
                    continue
                if stream.due:
                    yield self._tokens_event(stream)
                if stream.ended and not stream.due:
                    yield FINISHED
                    return
        finally:
            self._streams.pop(stream, None)
            if feed is not None:
                feed.streams.pop(stream, None)
                feed.attached.discard(stream)
            self._log(name, stream.sent)

    async def Events(self, request: wpb.EventsRequest, context):
        feed = _Feed()
        self._feeds[feed.id] = feed
        try:
            yield wpb.EventBatch(feed_id=feed.id)
            while not feed.closed:
                await feed.wake.wait()
                feed.wake.clear()
                streams, feed.streams = feed.streams, {}
                batch = wpb.EventBatch()
                for stream in streams:
                    self._feed_events(batch, stream, request.token_runs)
                if batch.events or batch.run_request_ids:
                    yield batch
                for stream in streams:
                    stream.wake.set()  # a stream that ended ends its Decode call now: after its events
        finally:
            del self._feeds[feed.id]
            feed.closed = True
            for stream in feed.attached:
                stream.wake.set()

    async def MatchPrefix(self, request: wpb.MatchPrefixRequest, context) -> wpb.MatchPrefixResponse:
        return wpb.MatchPrefixResponse(cached_tokens=0)

    async def Abort(self, request: wpb.WorkerAbortRequest, context) -> wpb.WorkerAbortResponse:
        return wpb.WorkerAbortResponse(found=False)  # a stream ends when the router cancels its call

    async def Stats(self, request: wpb.StatsRequest, context) -> wpb.WorkerStats:
        return wpb.WorkerStats(role="decode", blocks_total=BLOCKS, blocks_free=BLOCKS, requests_running=self.running,
                               identity=self._identity)

    async def _run_clock(self) -> None:
        tick = time.monotonic()
        while self._streams:
            tick = max(tick + self._step_s, time.monotonic())
            await asyncio.sleep(tick - time.monotonic())
            now = time.monotonic()
            for stream in list(self._streams):
                self._given(stream, now)

    def _given(self, stream: _Stream, now: float) -> None:
        if not stream.step(now):
            return
        if stream.feed is None:
            stream.wake.set()
        else:
            stream.feed.streams[stream] = None
            stream.feed.wake.set()

    def _tokens_event(self, stream: _Stream) -> wpb.DecodeEvent:
        return wpb.DecodeEvent(tokens=wpb.DecodeTokens(token_ids=self._due_tokens(stream)))

    def _due_tokens(self, stream: _Stream) -> list[int]:
        due, stream.due = stream.due, []
        stream.sent += [time.monotonic_ns()] * len(due)
        return [self._tokens[k % len(self._tokens)] for k in due]

    def _feed_events(self, batch: wpb.EventBatch, stream: _Stream, runs: bool) -> None:
        if stream not in self._streams:  # cancelled meanwhile
            return
        if stream.due and runs:  # packed (pdserve/rpc/feed.py)
            token_ids = self._due_tokens(stream)
            batch.run_request_ids.append(stream.worker_id)
            batch.run_lengths.append(len(token_ids))
            batch.run_token_ids.extend(token_ids)
            stream.fed += 1
        elif stream.due:
            batch.events.add(request_id=stream.worker_id, event=self._tokens_event(stream))
            stream.fed += 1
        if stream.ended and not stream.finish_sent:
            batch.events.add(request_id=stream.worker_id, event=FINISHED)
            stream.fed += 1
            stream.finish_sent = True
