"""The router's end of a decode worker's event feed (router/fleet/grpc_feed.py) against a scripted
worker: each request's events come whole and in order before its end or fault, whichever of
its two streams the router hears first; a broken feed fails every request on it (GONE) after the
events it carried, and the next request opens a new one; events of no request here are dropped."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from pdserve.requests import FinishReason, Priority, SamplingParams
from pdserve.rpc.channels import ChannelPool
from pdserve.rpc.errors import ErrorInterceptor
from pdserve.v1 import generation_pb2 as gpb
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.events import Finished, Tokens
from router.fleet.clients import FaultKind, WorkerFault, WorkerJob
from router.fleet.grpc_clients import GrpcWorkerClients
from router.flow.stream import Pumped
from tests.helpers.waiting import async_wait_until

pytestmark = pytest.mark.timeout(30)
WAIT_S = 10.0  # for what must come; never reached when the router behaves


def _tokens(*ids: int) -> wpb.DecodeEvent:
    return wpb.DecodeEvent(tokens=wpb.DecodeTokens(token_ids=list(ids)))


FINISHED = wpb.DecodeEvent(finished=wpb.DecodeFinished(finish_reason=gpb.FINISH_REASON_LENGTH))


class Scripted(worker_pb2_grpc.DecodeWorkerServicer):
    """Each Decode names the feed and ends (`fed` n, then `error` or OK) before its n events go
    by the feed: those wait until the Decode handler has returned."""

    def __init__(self, events: list[wpb.DecodeEvent], error: grpc.StatusCode | None = None, break_after: bool = False):
        self.events = events
        self.error = error
        self.break_after = break_after  # the feed fails after carrying them
        self.feeds = 0
        self.release = asyncio.Event()  # the feed sends what waits (the test sets it)
        self.release.set()
        self._ended: asyncio.Queue[str] = asyncio.Queue()

    async def Events(self, request, context):
        self.feeds += 1
        yield wpb.EventBatch(feed_id=f"feed-{self.feeds}")
        while True:
            request_id = await self._ended.get()
            await self.release.wait()
            ghost = wpb.FedEvent(request_id="ghost@1.x", event=_tokens(99))
            yield wpb.EventBatch(events=[ghost, *(wpb.FedEvent(request_id=request_id, event=e) for e in self.events)])
            if self.break_after:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the feed broke")

    async def Decode(self, request, context):
        assert request.feed_id == f"feed-{self.feeds}"
        try:
            yield wpb.DecodeEvent(fed=wpb.FedEvents(events=len(self.events)))
            if self.error is not None:
                await context.abort(self.error, "failed here")
        finally:
            self._ended.put_nowait(request.request.request_id)


async def _serve(servicer):
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    worker_pb2_grpc.add_DecodeWorkerServicer_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    return server, address


def _job(request_id: str) -> WorkerJob:
    return WorkerJob(request_id, (1, 2, 3), SamplingParams(max_tokens=4), Priority.NORMAL, 10.0)


async def _read(call: Pumped) -> list:
    """Events to the end; the fault, if one ends it, last."""
    items = []
    try:
        while True:
            items.append(await asyncio.wait_for(call.next(), WAIT_S))
    except StopAsyncIteration:
        return items
    except WorkerFault as fault:
        return [*items, fault]


def _run(servicer: Scripted, requests: int = 1) -> tuple[list[list], int]:
    """`requests` one after another, each once the last one's feed is whole or known broken."""
    async def main():
        server, address = await _serve(servicer)
        clients = GrpcWorkerClients(ChannelPool())
        try:
            seen = []
            for i in range(requests):
                call = Pumped(clients.decode(address).open(_job(f"r{i}@1.ab"), True), address)
                try:
                    seen.append(await _read(call))
                finally:
                    call.close()
                if servicer.break_after:
                    await async_wait_until(lambda: clients.feeds.get(address).broken is not None, WAIT_S, "the feed broken")
            return seen, servicer.feeds
        finally:
            await clients.channels.close()
            await server.stop(None)

    return asyncio.run(main())


def _held_run(servicer: Scripted) -> list:
    """One request whose Decode call the router has seen end before its feed sends anything."""
    async def main():
        server, address = await _serve(servicer)
        clients = GrpcWorkerClients(ChannelPool())
        servicer.release.clear()
        try:
            fed = clients.decode(address).open(_job("r@1.ab"), True)
            call = Pumped(fed, address)
            # NOTE: the Decode call's own end, read through the call object the FedCall holds
            await async_wait_until(lambda: fed._call is not None and fed._call.done(), WAIT_S, "the Decode call ended")
            servicer.release.set()
            return await _read(call)
        finally:
            await clients.channels.close()
            await server.stop(None)

    return asyncio.run(main())


@pytest.mark.parametrize("held", [False, True])
def test_a_requests_end_waits_for_the_events_its_worker_sent_by_the_feed(held):
    servicer = Scripted([_tokens(1), _tokens(2, 3), FINISHED])
    seen = _held_run(servicer) if held else _run(servicer)[0][0]
    assert seen == [Tokens((1,)), Tokens((2, 3)), Finished(FinishReason.LENGTH, 0, 0)]


@pytest.mark.parametrize("held", [False, True])
def test_a_requests_fault_comes_after_the_events_that_went_before_it(held):
    servicer = Scripted([_tokens(1), _tokens(2)], error=grpc.StatusCode.ABORTED)
    seen = _held_run(servicer) if held else _run(servicer)[0][0]
    assert seen[:2] == [Tokens((1,)), Tokens((2,))]
    assert isinstance(seen[2], WorkerFault) and seen[2].kind is FaultKind.ABORTED and len(seen) == 3


def test_a_broken_feed_fails_its_requests_gone_and_the_next_request_opens_another():
    seen, feeds = _run(Scripted([_tokens(1), _tokens(2)], break_after=True), requests=2)
    for one in seen:  # its events by the feed, then the feed's break, or the end it waited for
        assert one[:2] == [Tokens((1,)), Tokens((2,))]
        assert len(one) == 2 or (len(one) == 3 and one[2].kind is FaultKind.GONE)
    assert feeds == 2


def test_a_call_closed_before_its_feed_is_ready_hands_over_nothing():
    async def main():
        server, address = await _serve(Scripted([_tokens(1), FINISHED]))
        clients = GrpcWorkerClients(ChannelPool())
        try:
            call = Pumped(clients.decode(address).open(_job("r@1.ab"), True), address)
            call.close()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(call.next(), 0.5)
            return await _read(Pumped(clients.decode(address).open(_job("s@1.ab"), True), address))
        finally:
            await clients.channels.close()
            await server.stop(None)

    assert asyncio.run(main()) == [Tokens((1,)), Finished(FinishReason.LENGTH, 0, 0)]


class Packed(Scripted):
    """As Scripted, the request's first event a token run (as pdserve/rpc/feed.py packs it) beside a
    run of no request here; `bad`: the runs' lengths do not add up to their tokens."""

    def __init__(self, events: list[wpb.DecodeEvent], bad: bool = False):
        super().__init__(events)
        self.bad = bad
        self.asked_runs: list[bool] = []

    async def Events(self, request, context):
        self.asked_runs.append(request.token_runs)
        self.feeds += 1
        yield wpb.EventBatch(feed_id=f"feed-{self.feeds}")
        while True:
            request_id = await self._ended.get()
            first, *rest = self.events
            ids = list(first.tokens.token_ids)
            yield wpb.EventBatch(run_request_ids=["ghost@1.x", request_id], run_lengths=[1, len(ids) + self.bad],
                                 run_token_ids=[99, *ids],
                                 events=[wpb.FedEvent(request_id=request_id, event=e) for e in rest])


def test_a_messages_token_runs_come_before_its_events_and_the_router_asks_for_them():
    servicer = Packed([_tokens(1, 2), _tokens(3), FINISHED])
    seen = _run(servicer)[0][0]
    assert seen == [Tokens((1, 2)), Tokens((3,)), Finished(FinishReason.LENGTH, 0, 0)]
    assert servicer.asked_runs == [True]


def test_token_runs_that_do_not_add_up_break_the_feed_failing_its_requests():
    seen = _run(Packed([_tokens(1, 2), FINISHED], bad=True))[0][0]
    assert len(seen) == 1 and isinstance(seen[0], WorkerFault) and seen[0].kind is FaultKind.FAILED
    assert "do not add up" in str(seen[0])


class Leaving(Scripted):
    """As Scripted, the worker saying on the feed that it leaves before the request's events."""

    async def Events(self, request, context):
        self.feeds += 1
        yield wpb.EventBatch(feed_id=f"feed-{self.feeds}")
        request_id = await self._ended.get()
        yield wpb.EventBatch(leaving=True)
        yield wpb.EventBatch(events=[wpb.FedEvent(request_id=request_id, event=e) for e in self.events])
        await asyncio.Event().wait()


def test_a_worker_saying_it_leaves_wakes_its_requests_check_at_once_and_is_no_event_of_theirs():
    async def main():
        server, address = await _serve(Leaving([_tokens(1), FINISHED]))
        clients = GrpcWorkerClients(ChannelPool())
        try:
            call = Pumped(clients.decode(address).open(_job("r@1.ab"), True), address)
            try:
                check = await asyncio.wait_for(call.next_within(3600.0), WAIT_S)  # no period passes
                return check, call.leaving, await _read(call)
            finally:
                call.close()
        finally:
            await clients.channels.close()
            await server.stop(None)

    check, leaving, events = asyncio.run(main())
    assert check is None and leaving
    assert events == [Tokens((1,)), Finished(FinishReason.LENGTH, 0, 0)]  # the end waited for both, not the notice
