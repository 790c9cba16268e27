"""Starts a decode worker: engine, KV receiver over its pool, gRPC server."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from decode_service.servicer import DecodeServicer
from decode_service.worker import DecodeWorker
from pdserve.rpc.server import RunningServer, ServiceBinding, start_server
from pdserve.transfer import KVReceiver, make_transport
from pdserve.v1 import worker_pb2, worker_pb2_grpc
from pdserve.worker.metrics_feed import MetricsFeed
from pdserve.worker.observability import Observability, start_observability
from pdserve.worker.runtime import WorkerRuntime, build_runtime


@dataclass
class DecodeService:
    runtime: WorkerRuntime
    server: RunningServer
    receiver: KVReceiver | None
    observability: Observability
    feed: MetricsFeed

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def metrics_port(self) -> int | None:
        return self.observability.metrics_port

    async def stop(self) -> None:
        self.feed.stop()
        await self.server.stop(1.0)
        if self.receiver is not None:
            await self.receiver.close()
        self.runtime.stop()
        self.observability.stop()


async def start_decode(args: argparse.Namespace) -> DecodeService:
    obs = start_observability("pdserve-decode", args)
    runtime = build_runtime(args, hold_blocks=False)
    feed = MetricsFeed(runtime.async_engine, obs.metrics)
    receiver = make_transport("ucx").receiver(runtime.engine.kv.data) if args.transport == "ucx" else None
    worker = DecodeWorker(runtime.async_engine, receiver)
    host = args.advertise_host or args.host
    servicer = DecodeServicer(worker, args.transport, receiver.address() if receiver else b"", "",
                              runtime.block_size, runtime.block_nbytes, obs.tracing.tracer())
    name = worker_pb2.DESCRIPTOR.services_by_name["DecodeWorker"].full_name
    server = await start_server([ServiceBinding(worker_pb2_grpc.add_DecodeWorkerServicer_to_server, servicer, name)],
                                args.host, args.port)
    servicer.endpoint = f"{host}:{server.port}"
    feed.start()
    await server.set_serving(True)
    return DecodeService(runtime, server, receiver, obs, feed)
