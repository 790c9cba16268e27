"""Starts a prefill worker: engine (holding blocks under transfer), KV sender, gRPC server."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pdserve.rpc.channels import ChannelPool, split_addresses
from pdserve.rpc.drain import Drain
from pdserve.rpc.registration import Registration
from pdserve.rpc.security import security_from_args
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
    worker: PrefillWorker
    drainer: Drain
    registration: Registration

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def metrics_port(self) -> int | None:
        return self.observability.metrics_port

    async def drain(self, timeout_s: float) -> int:
        await self.server.set_serving(False)
        self.registration.stop()
        return await self.drainer.wait_idle(lambda: len(self.worker.sessions), timeout_s)

    async def stop(self) -> None:
        self.registration.stop()
        self.feed.stop()
        await self.server.stop(1.0)
        await self.sender.close()
        await self.channels.close()
        self.runtime.stop()
        self.observability.stop()


async def start_prefill(args: argparse.Namespace) -> PrefillService:
    security = security_from_args(args)
    obs = start_observability("pdserve-prefill", args)
    runtime = build_runtime(args, hold_blocks=True)
    feed = MetricsFeed(runtime.async_engine, obs.metrics)
    sender = make_transport("ucx").sender(runtime.engine.kv.data)
    channels = ChannelPool(security)
    worker = PrefillWorker(runtime.async_engine, sender, GrpcDecodePeer(channels), runtime.block_size,
                           runtime.block_nbytes)
    drainer = Drain()
    name = worker_pb2.DESCRIPTOR.services_by_name["PrefillWorker"].full_name
    servicer = PrefillServicer(worker, obs.tracing.tracer(), obs.metrics, drainer)
    server = await start_server([ServiceBinding(worker_pb2_grpc.add_PrefillWorkerServicer_to_server, servicer, name)],
                                args.host, args.port, security.server_credentials(),
                                security.server_interceptors(), args.health_port)
    address = f"{args.advertise_host or args.host}:{server.port}"
    registration = Registration(channels, split_addresses(args.register_with), address, "prefill")
    feed.start()
    registration.start()
    await server.set_serving(True)
    return PrefillService(runtime, server, sender, channels, obs, feed, worker, drainer, registration)
