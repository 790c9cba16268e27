"""Bearer tokens on unary and streaming calls, both directions of the interceptors."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pdserve.rpc.channels import ChannelPool
from pdserve.rpc.security import Security, TokenGuard

pytestmark = pytest.mark.timeout(60)
TRACE = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)


async def _calls(pool: ChannelPool, port: int) -> tuple:
    stub = health_pb2_grpc.HealthStub(pool.get(f"127.0.0.1:{port}"))
    results = []
    try:
        results.append((await stub.Check(health_pb2.HealthCheckRequest(), metadata=TRACE, timeout=5)).status)
    except grpc.aio.AioRpcError as exc:
        results.append(exc.code())
    call = stub.Watch(health_pb2.HealthCheckRequest(), metadata=TRACE, timeout=5)
    try:
        async for message in call:
            results.append(message.status)
            break
    except grpc.aio.AioRpcError as exc:
        results.append(exc.code())
    call.cancel()
    await pool.close()
    return tuple(results)


async def _run(client: Security) -> tuple:
    server = grpc.aio.server(interceptors=[TokenGuard(("/grpc.health.v1.Health/",), ("other", "sekret"))])
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        return await _calls(ChannelPool(client), port)
    finally:
        await server.stop(0)


def test_the_cluster_token_reaches_unary_and_streaming_calls():
    serving = health_pb2.HealthCheckResponse.SERVING
    assert asyncio.run(_run(Security(cluster_token="sekret"))) == (serving, serving)


@pytest.mark.parametrize("token", [None, "wrong"])
def test_missing_or_wrong_token_is_unauthenticated(token):
    refused = grpc.StatusCode.UNAUTHENTICATED
    assert asyncio.run(_run(Security(cluster_token=token))) == (refused, refused)


def test_plaintext_without_certificates_and_tls_with_them():
    assert Security().server_credentials() is None and Security().channel_credentials() is None
    assert Security(ca=b"x").channel_options() == () and Security(server_name="n").channel_options()
