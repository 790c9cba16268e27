"""Starts a prefill worker: engine (holding blocks under transfer), KV sender, gRPC server."""

from __future__ import annotations

import argparse

from pdserve.parallel.kv_ranks import open_sender
from pdserve.rpc.channels import ChannelPool, split_addresses
from pdserve.rpc.drain import Drain
from pdserve.rpc.registration import Registration
from pdserve.rpc.security import security_from_args
from pdserve.rpc.server import ServiceBinding, start_server
from pdserve.transfer import make_transport
from pdserve.v1 import worker_pb2, worker_pb2_grpc
from pdserve.worker.leases import Leases
from pdserve.worker.metrics_feed import MetricsFeed
from pdserve.worker.observability import start_observability
from pdserve.worker.runtime import RuntimeConfig, build_runtime
from pdserve.worker.service import WorkerService
from prefill_service.servicer import GrpcDecodePeer, PrefillServicer
from prefill_service.worker import PrefillWorker


async def start_prefill(args: argparse.Namespace, runtime_config: RuntimeConfig) -> WorkerService:
    security = security_from_args(args)
    obs = start_observability("pdserve-prefill", args)
    runtime = build_runtime(runtime_config, hold_blocks=True)
    leases = Leases()
    feed = MetricsFeed(runtime.async_engine, obs.metrics, leases)
    kv = runtime.engine.kv
    sender = await open_sender(make_transport("ucx").sender(kv.data), runtime.engine.loaded.ranks,
                               kv.shape.num_kv_heads)
    channels = ChannelPool(security)
    worker = PrefillWorker(runtime.async_engine, sender, GrpcDecodePeer(channels), runtime.block_size,
                           runtime.block_nbytes, leases)
    drainer = Drain()
    name = worker_pb2.DESCRIPTOR.services_by_name["PrefillWorker"].full_name
    servicer = PrefillServicer(worker, obs.tracing.tracer(), obs.metrics, drainer, "ucx")
    server = await start_server([ServiceBinding(worker_pb2_grpc.add_PrefillWorkerServicer_to_server, servicer, name)],
                                args.host, args.port, security.server_credentials(),
                                security.server_interceptors(), args.health_port)
    address = f"{args.advertise_host or args.host}:{server.port}"
    registration = Registration(channels, split_addresses(args.register_with), address, "prefill")
    feed.start()
    registration.start()
    await server.set_serving(True)
    return WorkerService(runtime, server, sender, channels, obs, feed, drainer, registration,
                         lambda: len(worker.sessions))
