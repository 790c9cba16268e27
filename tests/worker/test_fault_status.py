"""Statuses the worker servers send: a decode worker's fault seen by a prefill worker is charged
to the decode worker (UNAVAILABLE + `pdserve-fault: decode`); a dead engine is UNAVAILABLE."""

import asyncio

import grpc
import pytest

from pdserve.errors import EngineFailed, InvalidRequestError, PeerFault
from pdserve.rpc.channels import ChannelPool
from pdserve.rpc.errors import ErrorInterceptor
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.decode_peer import GrpcDecodePeer
from pdserve.worker.kv_out import Piece

pytestmark = pytest.mark.timeout(60)


class FailingPrefill(worker_pb2_grpc.PrefillWorkerServicer):
    def __init__(self, error: Exception):
        self.error = error

    async def Prefill(self, request, context):
        yield wpb.PrefillEvent(chunk=wpb.PrefillChunk(start=0, num_tokens=8))
        raise self.error


class RefusingDecode(worker_pb2_grpc.DecodeWorkerServicer):
    async def PushKV(self, request, context):
        raise InvalidRequestError(f"no transfer {request.transfer_id!r} was set up here")


async def _serve(add, servicer):
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _prefill_status(error: Exception):
    server, address = await _serve(worker_pb2_grpc.add_PrefillWorkerServicer_to_server, FailingPrefill(error))
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            call = worker_pb2_grpc.PrefillWorkerStub(channel).Prefill(wpb.PrefillRequest())
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                async for _ in call:
                    pass
            return raised.value.code(), tuple(raised.value.trailing_metadata() or ())
    finally:
        await server.stop(None)


def test_a_peer_fault_ends_the_stream_unavailable_and_names_the_decode_worker():
    code, trailing = asyncio.run(_prefill_status(PeerFault("PushKV on decode worker d:1: INVALID_ARGUMENT")))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert ("pdserve-fault", "decode") in trailing


def test_a_failed_engine_is_unavailable_and_names_nobody_else():
    code, trailing = asyncio.run(_prefill_status(EngineFailed("the engine of this worker failed: boom")))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert all(key != "pdserve-fault" for key, _ in trailing)


def test_other_errors_keep_their_status():
    code, trailing = asyncio.run(_prefill_status(InvalidRequestError("bad")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and all(key != "pdserve-fault" for key, _ in trailing)


def test_a_decode_workers_refusal_is_a_peer_fault_on_the_prefill_side():
    async def main():
        server, address = await _serve(worker_pb2_grpc.add_DecodeWorkerServicer_to_server, RefusingDecode())
        channels = ChannelPool()
        try:
            with pytest.raises(PeerFault, match="INVALID_ARGUMENT: no transfer 't#3' was set up here"):
                await GrpcDecodePeer(channels).push_kv(address, Piece("t#3", 0, 0, (1, 2), 5.0, b"s" * 16))
        finally:
            await channels.close()
            await server.stop(None)

    asyncio.run(main())
