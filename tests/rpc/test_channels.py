"""The internal channels give up on a silent peer within seconds: their keepalive pings, and every
other ping, time out as soon as the keepalive does (grpc-core's own ping timeout is 60 s: a
SIGSTOPped decode worker held its streams that long; benchmarks/stall_detection.py)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from pdserve.rpc.channels import CHANNEL_OPTIONS, ChannelPool
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc


def test_every_ping_of_an_internal_channel_times_out_with_the_keepalive():
    options = dict(CHANNEL_OPTIONS)
    assert options["grpc.keepalive_time_ms"] <= 2000 and options["grpc.keepalive_timeout_ms"] <= 2000
    assert options["grpc.http2.ping_timeout_ms"] <= options["grpc.keepalive_timeout_ms"]


class _Steps(worker_pb2_grpc.DecodeWorkerServicer):
    """A worker whose event feed writes step messages as fast as the connection takes them."""

    def __init__(self) -> None:
        self.written = 0

    async def Events(self, request, context):
        batch = wpb.EventBatch(run_request_ids=["r"] * 20, run_lengths=[1] * 20, run_token_ids=list(range(20)))
        while True:
            await context.write(batch)
            self.written += 1


async def _written_while_the_reader_stops() -> int:
    """Bytes of step messages a worker wrote in the second its feed's reader read nothing."""
    worker, server, pool = _Steps(), grpc.aio.server(), ChannelPool()
    worker_pb2_grpc.add_DecodeWorkerServicer_to_server(worker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        call = worker_pb2_grpc.DecodeWorkerStub(pool.feed(f"127.0.0.1:{port}")).Events(wpb.EventsRequest())
        for _ in range(50):
            size = (await call.read()).ByteSize()
        before = worker.written
        await asyncio.sleep(1.0)  # the reader stops; the worker writes until its writes wait
        call.cancel()
        return (worker.written - before) * size
    finally:
        await pool.close()
        await server.stop(0)


@pytest.mark.timeout(60)
def test_a_feed_reader_that_falls_behind_holds_a_small_window_of_it_not_seconds():
    """A router that stops reading its feed makes the worker's writes wait after a few KiB (there its
    feed joins each request's tokens: pdserve/worker/feed.py), instead of gRPC's bandwidth probe
    growing the window until megabytes of step messages queue ahead of what comes next (a call's
    channel: 4.4 MB in that second)."""
    assert asyncio.run(_written_while_the_reader_stops()) <= 256 * 1024


class _Idle(worker_pb2_grpc.DecodeWorkerServicer):
    async def Events(self, request, context):
        yield wpb.EventBatch()


async def _a_feed_after_its_worker_came_back() -> wpb.EventBatch:
    """A feed opened while its worker is down (it fails), then again at once once the worker serves
    on the same port."""
    probe = grpc.aio.server()
    port = probe.add_insecure_port("127.0.0.1:0")  # a free port, then nothing listens there
    await probe.start()
    await probe.stop(0)
    pool, address = ChannelPool(), f"127.0.0.1:{port}"
    server = grpc.aio.server()
    try:
        with pytest.raises(grpc.aio.AioRpcError):
            await worker_pb2_grpc.DecodeWorkerStub(pool.feed(address)).Events(wpb.EventsRequest()).read()
        worker_pb2_grpc.add_DecodeWorkerServicer_to_server(_Idle(), server)
        server.add_insecure_port(address)
        await server.start()
        call = worker_pb2_grpc.DecodeWorkerStub(pool.feed(address)).Events(wpb.EventsRequest())
        return await call.read()
    finally:
        await pool.close()
        await server.stop(0)


@pytest.mark.timeout(60)
def test_a_feed_opened_as_its_worker_comes_back_connects_at_once():
    """The feed channel that failed while the worker was down is not left in its reconnect backoff:
    the first feed after the restart gets the worker's first message (it failed with UNAVAILABLE:
    a router's requests failed after the routers said SERVING again)."""
    assert asyncio.run(_a_feed_after_its_worker_came_back()) == wpb.EventBatch()
