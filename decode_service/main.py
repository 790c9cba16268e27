"""Starts a decode worker: engine, KV receiver over its pool, gRPC server."""

from __future__ import annotations

import argparse

from decode_service.servicer import DecodeServicer
from decode_service.worker import DecodeWorker
from pdserve.parallel.kv_ranks import RanksReceiver, open_receiver
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
from pdserve.worker.runtime import RuntimeConfig, WorkerRuntime, build_runtime
from pdserve.worker.service import WorkerService


async def _receiver(runtime: WorkerRuntime) -> RanksReceiver:
    """Every rank's UCX receiver over its own heads' pool, rank 0's here."""
    kv = runtime.engine.kv
    return await open_receiver(make_transport("ucx").receiver(kv.data), runtime.engine.loaded.ranks,
                               kv.shape.num_kv_heads)


async def start_decode(args: argparse.Namespace, runtime_config: RuntimeConfig) -> WorkerService:
    security = security_from_args(args)
    obs = start_observability("pdserve-decode", args)
    runtime = build_runtime(runtime_config, hold_blocks=False)
    leases = Leases()
    feed = MetricsFeed(runtime.async_engine, obs.metrics, leases)
    receiver = await _receiver(runtime) if args.transport == "ucx" else None
    worker = DecodeWorker(runtime.async_engine, receiver, leases, args.quarantine_timeout_s)
    drainer = Drain()
    servicer = DecodeServicer(worker, args.transport, receiver.address() if receiver else b"", "",
                              runtime.block_size, runtime.block_nbytes, runtime.engine.kv.num_blocks,
                              obs.tracing.tracer(), drainer, receiver.ends if receiver else ())
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
    return WorkerService(runtime, server, receiver, channels, obs, feed, drainer, registration,
                         lambda: len(worker.sessions))
