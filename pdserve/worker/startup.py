"""How a worker process starts, for both roles, around the part that is each role's own:

    lay_groundwork(args, config, role)   security, tracing and /metrics, the engine on its thread,
                                         leases, the metrics feed, channels to peers, the drain
    the role's main                      its KV end (sender or receiver), worker and servicer
    serve(args, ground, role, ...)       gRPC server up, NOT_SERVING -> the servicer learns its address
                                         -> metrics feed and registry heartbeat start -> SERVING

Each part is a phase of the start's phase log (pdserve/start_phases.py: imports, the engine's own
phases, the role's part, the server), logged at INFO once the worker serves.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from pdserve.identity import WorkerIdentity, model_fingerprint
from pdserve.native.build import build_behind
from pdserve.native.loader import every_source
from pdserve.rpc.channels import ChannelPool, split_addresses
from pdserve.rpc.drain import Drain
from pdserve.rpc.registration import Registration
from pdserve.rpc.stats import identity_to_pb
from pdserve.rpc.security import Security, security_from_args
from pdserve.rpc.server import ServiceBinding, start_server
from pdserve.start_phases import StartPhases
from pdserve.transfer.ucx_env import without_memory_events
from pdserve.v1 import worker_pb2
from pdserve.worker.client_aborts import ClientAborts
from pdserve.worker.leases import Leases
from pdserve.worker.metrics_feed import MetricsFeed
from pdserve.worker.observability import Observability, start_observability
from pdserve.worker.rpcs import CommonWorkerRpcs
from pdserve.worker.runtime import RuntimeConfig, WorkerRuntime, build_runtime
from pdserve.worker.service import TransferEnd, WorkerService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Role:
    """A worker role, as start-up needs to know it."""

    name: str  # "prefill" | "decode": its role in the registry; its tracer's service is pdserve-<name>
    service: str  # its gRPC service in worker.proto
    add_to_server: Callable[[object, grpc.aio.Server], None]  # the generated registration of that service
    hold_blocks: bool  # the engine holds a request's blocks until their KV was sent (prefill)


@dataclass
class Groundwork:
    """What every worker builds before its role's own part."""

    security: Security
    observability: Observability
    runtime: WorkerRuntime
    leases: Leases
    feed: MetricsFeed  # not started until the worker serves
    channels: ChannelPool
    drainer: Drain
    identity: WorkerIdentity  # what it serves: in its Stats and its reservations
    phases: StartPhases  # the start's phase log, up to the groundwork so far


def lay_groundwork(args: argparse.Namespace, config: RuntimeConfig, role: Role) -> Groundwork:
    """On the running event loop (the engine thread starts on it). On a CPU, the C kernels not
    built yet on this machine build behind it (a first start), and UCX loads without the memory
    events nothing here needs (pdserve/transfer/ucx_env.py)."""
    phases = StartPhases.since_process_start()
    on_cpu = config.engine.device == "cpu"
    if on_cpu:
        build_behind(every_source())
    without_memory_events(os.environ, on_cpu)
    security = security_from_args(args)
    observability = start_observability(f"pdserve-{role.name}", args)
    phases.done("observability")
    runtime = build_runtime(config, hold_blocks=role.hold_blocks, phases=phases)
    leases = Leases()
    feed = MetricsFeed(runtime.async_engine, observability.metrics, leases)
    identity = WorkerIdentity(model_fingerprint(config.engine.model), str(runtime.engine.kv.data.dtype),
                              runtime.block_size, tensor_parallel_size=config.engine.tensor_parallel_size)
    phases.done("identity")
    return Groundwork(security, observability, runtime, leases, feed, ChannelPool(security), Drain(), identity,
                      phases)


async def serve(args: argparse.Namespace, ground: Groundwork, role: Role, servicer: CommonWorkerRpcs,
                transfer: TransferEnd | None) -> WorkerService:
    """Start the server with `servicer` and put the worker in rotation; `transfer`: its KV end
    (None: a decode worker without UCX), closed when the worker stops."""
    return await serve_roles(args, ground, role.name, [(role, servicer)], (transfer,) if transfer else (),
                             servicer.in_flight)


async def serve_roles(args: argparse.Namespace, ground: Groundwork, registered_as: str,
                      roles: list[tuple[Role, CommonWorkerRpcs]], transfers: tuple[TransferEnd, ...],
                      in_flight: Callable[[], int], extra: tuple[ServiceBinding, ...] = ()) -> WorkerService:
    """`serve` for one or more roles' servicers on one server (an elastic worker: both, and its
    WorkerControl in `extra`); it registers as `registered_as`, and `transfers` close at its stop."""
    ground.phases.done("kv transport and role")
    aborts = ClientAborts([servicer.worker.live for _, servicer in roles])  # one per process, over every role
    for _, servicer in roles:
        servicer.identity, servicer.aborts = ground.identity, aborts
    bindings = [ServiceBinding(role.add_to_server, servicer, worker_pb2.DESCRIPTOR.services_by_name[role.service].full_name)
                for role, servicer in roles]
    server = await start_server([*bindings, *extra], args.host, args.port, ground.security.server_credentials(),
                                ground.security.server_interceptors(), args.health_port)
    address = f"{args.advertise_host or args.host}:{server.port}"
    for _, servicer in roles:
        servicer.address = address
    registration = Registration(ground.channels, split_addresses(args.register_with), address, registered_as,
                                identity=identity_to_pb(ground.identity))
    ground.feed.start()
    registration.start()
    await server.set_serving(True)
    ground.phases.done("server")
    log.info("%s %s", registered_as, ground.phases.summary())
    return WorkerService(ground.runtime, server, transfers, ground.channels, ground.observability, ground.feed,
                         ground.drainer, registration, in_flight)
