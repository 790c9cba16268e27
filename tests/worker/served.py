"""A decode worker served over gRPC in process: a real engine on the tiny model, colocated (it
prefills itself), on a port of its own, for tests that call it as a router does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc
from opentelemetry import trace

from decode_service.servicer import DecodeServicer
from decode_service.worker import DecodeWorker
from pdserve.config import DeadlineConfig
from pdserve.rpc.drain import Drain
from pdserve.rpc.errors import ErrorInterceptor
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.leases import Leases
from tests.worker.pair import BLOCK, start_engine


@dataclass
class Served:
    worker: DecodeWorker
    servicer: DecodeServicer
    server: grpc.aio.Server
    address: str
    drain: Drain

    async def stop(self, grace_s: float | None = None) -> None:
        self.drain.stopping()
        await self.server.stop(grace_s)


@asynccontextmanager
async def served(loaded, servicer_class: type[DecodeServicer] = DecodeServicer,
                 reattach_grace_s: float = DeadlineConfig().reattach_grace_s) -> AsyncIterator[Served]:
    """`reattach_grace_s`: how long an orphaned request waits for an Attach (decode_service/orphans.py)."""
    engine = start_engine(loaded, hold_blocks=False, num_blocks=256, token_budget=64)
    worker = DecodeWorker(engine, None, Leases(), reattach_grace_s=reattach_grace_s)
    drain = Drain()
    servicer = servicer_class(worker, trace.get_tracer("test"), drain, "none", b"", BLOCK,
                              engine.engine.kv.block_nbytes, engine.engine.kv.num_blocks)
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    worker_pb2_grpc.add_DecodeWorkerServicer_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        yield Served(worker, servicer, server, address, drain)
    finally:
        await server.stop(None)
        engine.stop()
