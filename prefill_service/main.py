"""Starts a prefill worker: engine (holding blocks under transfer), KV sender, gRPC server."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pdserve.rpc.channels import ChannelPool
from pdserve.rpc.server import RunningServer, ServiceBinding, start_server
from pdserve.transfer import KVSender, make_transport
from pdserve.v1 import worker_pb2, worker_pb2_grpc
from pdserve.worker.metrics_feed import MetricsFeed
from pdserve.worker.observability import Observability, start_observability
from pdserve.worker.runtime import WorkerRuntime, build_runtime
from prefill_service.servicer import GrpcDecodePeer, PrefillServicer
from prefill_service.worker import PrefillWorker


@dataclass
class PrefillService:
    runtime: WorkerRuntime
    server: RunningServer
    sender: KVSender
    channels: ChannelPool
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
        await self.sender.close()
        await self.channels.close()
        self.runtime.stop()
        self.observability.stop()


async def start_prefill(args: argparse.Namespace) -> PrefillService:
    obs = start_observability("pdserve-prefill", args)
    runtime = build_runtime(args, hold_blocks=True)
    feed = MetricsFeed(runtime.async_engine, obs.metrics)
    sender = make_transport("ucx").sender(runtime.engine.kv.data)
    channels = ChannelPool()
    worker = PrefillWorker(runtime.async_engine, sender, GrpcDecodePeer(channels), runtime.block_size,
                           runtime.block_nbytes)
    name = worker_pb2.DESCRIPTOR.services_by_name["PrefillWorker"].full_name
    server = await start_server([ServiceBinding(worker_pb2_grpc.add_PrefillWorkerServicer_to_server,
                                                PrefillServicer(worker, obs.tracing.tracer(), obs.metrics), name)],
                                args.host, args.port)
    feed.start()
    await server.set_serving(True)
    return PrefillService(runtime, server, sender, channels, obs, feed)
