"""Boots one grpc.aio server with health checking, reflection and the shared interceptors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pdserve.rpc.errors import ErrorInterceptor

LIVENESS = "liveness"  # health's service for liveness probes: SERVING while the process answers, ready or not
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    # Clients ping every 2 s (pdserve/rpc/channels.py), also between calls: allow it.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
    # The server pings its clients as they ping it: a worker whose router went silent (its host cut
    # off, a partition) ends that router's streams and frees their blocks within about 4 s.
    ("grpc.keepalive_time_ms", 2000),
    ("grpc.keepalive_timeout_ms", 2000),
)


@dataclass(frozen=True)
class ServiceBinding:
    """A servicer, the generated function that registers it, and its full service name."""

    add_to_server: Callable[[object, grpc.aio.Server], None]
    servicer: object
    full_name: str


@dataclass
class RunningServer:
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int
    service_names: tuple[str, ...]
    health_server: grpc.aio.Server | None = None

    async def set_serving(self, serving: bool) -> None:
        """Readiness: the overall status ("") and every service's; LIVENESS stays SERVING."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def stop(self, grace_s: float | None = 1.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
        if self.health_server is not None:
            await self.health_server.stop(grace_s)


async def start_server(
    bindings: Sequence[ServiceBinding],
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    health_port: int | None = None,
) -> RunningServer:
    server = grpc.aio.server(interceptors=(*interceptors, ErrorInterceptor()), options=SERVER_OPTIONS)
    for binding in bindings:
        binding.add_to_server(binding.servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = tuple(b.full_name for b in bindings)
    reflection.enable_server_reflection((*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                         reflection.SERVICE_NAME), server)
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot listen on {address}")
    await server.start()
    running = RunningServer(server, health_servicer, bound, names)
    if health_port is not None:
        running.health_server = await _start_health_server(health_servicer, host, health_port)
    await running.set_serving(False)
    await health_servicer.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
    return running


async def _start_health_server(servicer: health.aio.HealthServicer, host: str, port: int) -> grpc.aio.Server:
    """Plaintext, health only: for probes that cannot speak TLS or send tokens."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen on {host}:{port} for health checks")
    await server.start()
    return server
