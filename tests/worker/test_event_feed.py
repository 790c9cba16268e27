"""A decode worker's event feed (DecodeWorker.Events) as the router reads it: a real decode worker
on the tiny model, served over gRPC in process, and the router's gRPC clients. Every request's
events come in order and whole, through the feed or without it; a call closed, a feed broken or a
worker stopped ends its requests on the worker, which gives every block back."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from decode_service.servicer import DecodeServicer
from pdserve.requests import Priority, SamplingParams
from pdserve.rpc.channels import ChannelPool
from pdserve.worker.events import Finished, Tokens
from router.fleet.clients import FaultKind, WorkerFault, WorkerJob
from router.fleet.grpc_clients import GrpcWorkerClients
from router.flow.stream import Pumped
from tests.worker.pair import settle
from tests.worker.served import served

pytestmark = pytest.mark.timeout(120)

PROMPT = tuple(range(5, 13))
HELD_TOKENS = 400  # still streaming when the test acts on it, at any speed of the tiny model


def _job(request_id: str, max_tokens: int) -> WorkerJob:
    return WorkerJob(request_id, PROMPT, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                     Priority.NORMAL, 10.0)


class NoFeed(DecodeServicer):
    """A decode worker from before event feeds: its server knows no Events method."""

    async def Events(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        yield  # an async generator, as a stream's handler is


async def _tokens(call: Pumped) -> list[int]:
    """Every token to the Finished event, which must come last."""
    tokens: list[int] = []
    while True:
        event = await call.next()
        if isinstance(event, Tokens):
            tokens.extend(event.token_ids)
        elif isinstance(event, Finished):
            return tokens


async def _streams(clients: GrpcWorkerClients, address: str, count: int, max_tokens: int) -> list[list[int]]:
    calls = [Pumped(clients.decode(address).open(_job(f"r{i}", max_tokens), True), address) for i in range(count)]
    try:
        return await asyncio.gather(*(_tokens(call) for call in calls))
    finally:
        for call in calls:
            call.close()


@pytest.mark.parametrize("feeds,servicer_class", [(True, DecodeServicer), (False, DecodeServicer),
                                                  (True, NoFeed)])
def test_every_request_gets_its_tokens_in_order_with_or_without_the_feed(tiny_llama, feeds, servicer_class):
    async def main():
        async with served(tiny_llama, servicer_class) as worker:
            clients = GrpcWorkerClients(ChannelPool(), feeds=feeds)
            try:
                streams = await _streams(clients, worker.address, 6, 24)
            finally:
                await clients.channels.close()
            return streams, await settle(worker.worker.engine)

    streams, left = asyncio.run(main())
    alone = _alone(tiny_llama)
    assert streams == [alone] * 6 and len(alone) == 24
    assert left == 0


def _alone(loaded) -> list[int]:
    async def main():
        async with served(loaded) as worker:
            clients = GrpcWorkerClients(ChannelPool(), feeds=False)
            try:
                return (await _streams(clients, worker.address, 1, 24))[0]
            finally:
                await clients.channels.close()

    return asyncio.run(main())


async def _first_tokens(calls: list[Pumped]) -> list[int]:
    """How many tokens each call's first event carried (more than one when the client read after
    several steps: a slow reader's events merge)."""
    counts = []
    for call in calls:
        event = await asyncio.wait_for(call.next(), 30)
        assert isinstance(event, Tokens)
        counts.append(len(event.token_ids))
    return counts


def test_a_closed_call_ends_its_request_on_the_worker_and_the_others_go_on(tiny_llama):
    async def main():
        async with served(tiny_llama) as worker:
            clients = GrpcWorkerClients(ChannelPool())
            try:
                calls = [Pumped(clients.decode(worker.address).open(_job(f"r{i}", 24 if i else HELD_TOKENS), True),
                                worker.address) for i in range(3)]
                first = await _first_tokens(calls)
                calls[0].close()  # its client went away
                rest = await asyncio.gather(*(_tokens(call) for call in calls[1:]))
                for call in calls[1:]:
                    call.close()
                return first[1:], rest, await settle(worker.worker.engine), len(worker.worker.live)
            finally:
                await clients.channels.close()

    first, rest, left, live = asyncio.run(main())
    assert [n + len(tokens) for n, tokens in zip(first, rest)] == [24, 24]  # every token, the first event's too
    assert left == 0 and live == 0


@pytest.mark.parametrize("broken_by", ["worker", "router", "stop"])
def test_a_broken_feed_fails_every_request_on_it_gone_and_frees_their_blocks(tiny_llama, broken_by):
    """The worker closes its feeds (it stops), the router forgets the worker, or the server stops."""
    async def main():
        async with served(tiny_llama) as worker:
            clients = GrpcWorkerClients(ChannelPool())
            try:
                calls = [Pumped(clients.decode(worker.address).open(_job(f"r{i}", HELD_TOKENS), True), worker.address)
                         for i in range(3)]
                await _first_tokens(calls)
                if broken_by == "worker":
                    worker.drain.stopping()
                elif broken_by == "router":
                    await clients.forget(worker.address)
                else:
                    await worker.stop(grace_s=0)
                faults = await asyncio.gather(*(_fault(call) for call in calls))
                for call in calls:
                    call.close()
                return faults, await settle(worker.worker.engine), len(worker.worker.live)
            finally:
                await clients.channels.close()

    faults, left, live = asyncio.run(main())
    assert all(fault.kind is FaultKind.GONE for fault in faults)
    assert left == 0 and live == 0


async def _fault(call: Pumped) -> WorkerFault:
    """The fault that ends the call, after whatever tokens came before it."""
    while True:
        try:
            event = await asyncio.wait_for(call.next(), 30)
        except WorkerFault as fault:
            return fault
        assert isinstance(event, Tokens), f"{event} before the fault"
