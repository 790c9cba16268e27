"""Starts a decode worker: engine, KV receiver over its pool, gRPC server."""

from __future__ import annotations

import argparse

from decode_service.servicer import DecodeServicer
from decode_service.worker import DecodeWorker
from pdserve.parallel.kv_ranks import RanksReceiver, open_receiver
from pdserve.transfer import make_transport
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.runtime import RuntimeConfig, WorkerRuntime
from pdserve.worker.service import WorkerService
from pdserve.worker.startup import Groundwork, Role, lay_groundwork, serve

DECODE = Role("decode", "DecodeWorker", worker_pb2_grpc.add_DecodeWorkerServicer_to_server, hold_blocks=False)


async def _receiver(runtime: WorkerRuntime) -> RanksReceiver:
    """Every rank's UCX receiver over its own heads' pool, rank 0's here."""
    kv = runtime.engine.kv
    return await open_receiver(make_transport("ucx").receiver(kv.data), runtime.engine.loaded.ranks,
                               kv.shape.num_kv_heads)


async def decode_parts(args: argparse.Namespace, ground: Groundwork,
                       releases_holds: bool = True) -> tuple[DecodeServicer, RanksReceiver | None]:
    """The decode role over a worker's groundwork: its KV receiver (none with --transport none),
    worker and servicer; `releases_holds` off beside a prefill worker on the same engine."""
    runtime = ground.runtime
    receiver = await _receiver(runtime) if args.transport == "ucx" else None
    worker = DecodeWorker(runtime.async_engine, receiver, ground.leases, args.quarantine_timeout_s, releases_holds)
    servicer = DecodeServicer(worker, ground.observability.tracing.tracer(), ground.drainer, args.transport,
                              receiver.address() if receiver else b"", runtime.block_size, runtime.block_nbytes,
                              runtime.engine.kv.num_blocks, receiver.ends if receiver else ())
    return servicer, receiver


async def start_decode(args: argparse.Namespace, runtime_config: RuntimeConfig) -> WorkerService:
    ground = lay_groundwork(args, runtime_config, DECODE)
    servicer, receiver = await decode_parts(args, ground)
    return await serve(args, ground, DECODE, servicer, receiver)
