"""Starts a decode worker: engine, KV receiver over its pool, gRPC server."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from decode_service.servicer import DecodeServicer
from decode_service.worker import DecodeWorker
from pdserve.rpc.channels import ChannelPool, split_addresses
from pdserve.rpc.drain import Drain
from pdserve.rpc.registration import Registration
from pdserve.rpc.security import security_from_args
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
    worker: DecodeWorker
    drainer: Drain
    registration: Registration
    channels: ChannelPool

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
        if self.receiver is not None:
            await self.receiver.close()
        await self.channels.close()
        self.runtime.stop()
        self.observability.stop()


async def start_decode(args: argparse.Namespace) -> DecodeService:
    security = security_from_args(args)
    obs = start_observability("pdserve-decode", args)
    runtime = build_runtime(args, hold_blocks=False)
    feed = MetricsFeed(runtime.async_engine, obs.metrics)
    receiver = make_transport("ucx").receiver(runtime.engine.kv.data) if args.transport == "ucx" else None
    worker = DecodeWorker(runtime.async_engine, receiver)
    drainer = Drain()
    servicer = DecodeServicer(worker, args.transport, receiver.address() if receiver else b"", "",
                              runtime.block_size, runtime.block_nbytes, obs.tracing.tracer(), drainer)
    name = worker_pb2.DESCRIPTOR.services_by_name["DecodeWorker"].full_name
    server = await start_server([ServiceBinding(worker_pb2_grpc.add_DecodeWorkerServicer_to_server, servicer, name)],
                                args.host, args.port, security.server_credentials(),
                                security.server_interceptors(), args.health_port)
    servicer.endpoint = f"{args.advertise_host or args.host}:{server.port}"
    channels = ChannelPool(security)
    registration = Registration(channels, split_addresses(args.register_with), servicer.endpoint, "decode")
    feed.start()
    registration.start()
    await server.set_serving(True)
    return DecodeService(runtime, server, receiver, obs, feed, worker, drainer, registration, channels)
