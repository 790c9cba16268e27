"""Starts a decode worker: engine, KV receiver over its pool (and a sender: its requests move to
another decode worker when it leaves), gRPC server."""

from __future__ import annotations

import argparse

from decode_service.departures import Departures
from decode_service.servicer import DecodeServicer
from decode_service.worker import DecodeWorker
from pdserve.parallel.kv_ranks import RanksReceiver, RanksSender, open_receiver, open_sender
from pdserve.worker.decode_peer import GrpcDecodePeer
from pdserve.transfer import make_transport
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.kv_sums import KVSums
from pdserve.worker.runtime import RuntimeConfig, WorkerRuntime
from pdserve.worker.service import WorkerService
from pdserve.worker.startup import Groundwork, Role, lay_groundwork, serve_roles

DECODE = Role("decode", "DecodeWorker", worker_pb2_grpc.add_DecodeWorkerServicer_to_server, hold_blocks=False)


async def _receiver(runtime: WorkerRuntime) -> RanksReceiver:
    """Every rank's UCX receiver over its own heads' pool, rank 0's here."""
    kv = runtime.engine.kv
    return await open_receiver(make_transport("ucx").receiver(kv.data), runtime.engine.loaded.ranks,
                               kv.shape.num_kv_heads)


async def decode_parts(args: argparse.Namespace, ground: Groundwork, releases_holds: bool = True,
                       sender: RanksSender | None = None
                       ) -> tuple[DecodeServicer, tuple[RanksReceiver | RanksSender, ...]]:
    """The decode role over a worker's groundwork: its KV receiver and sender (none with
    --transport none; no sender at tensor parallel size > 1, whose requests leave without their
    KV), worker and servicer, and the transfer ends it opened. `releases_holds`
    off and the prefill role's `sender` beside a prefill worker on the same engine."""
    runtime = ground.runtime
    kv = runtime.engine.kv
    ends: tuple[RanksReceiver | RanksSender, ...] = ()
    receiver = None
    if args.transport == "ucx":
        receiver = await _receiver(runtime)
        ends = (receiver,)
        if sender is None and not runtime.engine.loaded.ranks.kv_sockets():  # one rank: its requests can move
            local = make_transport("ucx").sender(kv.data)
            local.on_peer(ground.observability.metrics.count_kv_peer)
            sender = await open_sender(local, runtime.engine.loaded.ranks, kv.shape.num_kv_heads)
            ends = (receiver, sender)
    checksums = args.kv_checksums == "on"
    sums = KVSums.of(checksums, kv.data, len(sender.ports)) if sender is not None else None
    departures = Departures(runtime.async_engine, sender, GrpcDecodePeer(ground.channels) if sender is not None else None,
                            runtime.block_size, runtime.block_nbytes, ground.leases, sums)
    worker = DecodeWorker(runtime.async_engine, receiver, ground.leases, args.quarantine_timeout_s, releases_holds,
                          departures, checksums, args.reattach_grace_s)
    servicer = DecodeServicer(worker, ground.observability.tracing.tracer(), ground.drainer, args.transport,
                              receiver.address() if receiver else b"", runtime.block_size, runtime.block_nbytes,
                              kv.num_blocks, receiver.ends if receiver else ())
    return servicer, ends


async def start_decode(args: argparse.Namespace, runtime_config: RuntimeConfig) -> WorkerService:
    ground = lay_groundwork(args, runtime_config, DECODE)
    servicer, ends = await decode_parts(args, ground)
    return await serve_roles(args, ground, DECODE.name, [(DECODE, servicer)], ends, servicer.in_flight)
