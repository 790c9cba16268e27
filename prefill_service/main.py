"""Starts a prefill worker: engine (holding blocks under transfer), KV sender, gRPC server."""

from __future__ import annotations

import argparse

from pdserve.parallel.kv_ranks import open_sender
from pdserve.transfer import make_transport
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.kv_sums import KVSums
from pdserve.worker.runtime import RuntimeConfig
from pdserve.worker.service import TransferEnd, WorkerService
from pdserve.worker.startup import Groundwork, Role, lay_groundwork, serve
from pdserve.worker.decode_peer import GrpcDecodePeer
from prefill_service.servicer import PrefillServicer
from prefill_service.worker import PrefillWorker

PREFILL = Role("prefill", "PrefillWorker", worker_pb2_grpc.add_PrefillWorkerServicer_to_server, hold_blocks=True)


async def prefill_parts(ground: Groundwork, checksums: bool = True) -> tuple[PrefillServicer, TransferEnd]:
    """The prefill role over a worker's groundwork: its KV sender, worker and servicer;
    `checksums`: it sums the KV pieces it sends (where it can)."""
    runtime, obs = ground.runtime, ground.observability
    kv = runtime.engine.kv
    local = make_transport("ucx").sender(kv.data)
    local.on_peer(obs.metrics.count_kv_peer)
    sender = await open_sender(local, runtime.engine.loaded.ranks, kv.shape.num_kv_heads)
    worker = PrefillWorker(runtime.async_engine, sender, GrpcDecodePeer(ground.channels), runtime.block_size,
                           runtime.block_nbytes, ground.leases, KVSums.of(checksums, kv.data, len(sender.ports)))
    return PrefillServicer(worker, obs.tracing.tracer(), obs.metrics, ground.drainer, "ucx"), sender


async def start_prefill(args: argparse.Namespace, runtime_config: RuntimeConfig) -> WorkerService:
    ground = lay_groundwork(args, runtime_config, PREFILL)
    servicer, sender = await prefill_parts(ground, args.kv_checksums == "on")
    return await serve(args, ground, PREFILL, servicer, sender)
