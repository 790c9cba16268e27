"""A span around a streaming handler survives its stream being cancelled mid-write: it ends,
and nothing logs 'Failed to detach context' (the generator is closed in another context)."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
import uvloop
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pdserve.telemetry import stream_span
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc

pytestmark = pytest.mark.timeout(120)


class _Streamer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, tracer):
        self.tracer = tracer

    async def Generate(self, request, context):
        with stream_span(self.tracer, "pdserve.stream"):
            for i in range(1_000_000):  # always writing: a cancel finds it suspended at a yield
                yield pb.GenerateResponse(text=str(i))


async def _cancel_streams(tracer, n: int) -> None:
    server = grpc.aio.server()
    generation_pb2_grpc.add_GenerationServicer_to_server(_Streamer(tracer), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        for _ in range(n):
            call = stub.Generate(pb.GenerateRequest())
            await call.read()
            call.cancel()
            await asyncio.sleep(0.2)
    await server.stop(0)


def test_cancelled_streams_end_their_spans_and_log_nothing(caplog):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with caplog.at_level(logging.ERROR):
        uvloop.run(_cancel_streams(provider.get_tracer("test"), 3))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    assert [s.name for s in exporter.get_finished_spans()] == ["pdserve.stream"] * 3
