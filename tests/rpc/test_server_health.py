"""A server's health: readiness ("" and each service) follows set_serving; liveness (the probes'
`liveness` service) is SERVING from the start, ready or not (its health port shares the servicer)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve.rpc.server import LIVENESS, start_server

pytestmark = pytest.mark.timeout(60)
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def _status(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                                timeout=10)
        return reply.status


def test_liveness_is_serving_while_readiness_follows_set_serving():
    async def main():
        server = await start_server([], "127.0.0.1", 0)
        try:
            seen = [(await _status(server.port, ""), await _status(server.port, LIVENESS))]
            await server.set_serving(True)
            seen.append((await _status(server.port, ""), await _status(server.port, LIVENESS)))
            await server.set_serving(False)
            seen.append((await _status(server.port, ""), await _status(server.port, LIVENESS)))
            return seen
        finally:
            await server.stop(None)

    seen = asyncio.run(main())
    assert seen == [(NOT_SERVING, SERVING), (SERVING, SERVING), (NOT_SERVING, SERVING)]
