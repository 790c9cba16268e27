"""How the router learns its workers: a static list, DNS names (a headless Service), or workers
registering themselves. Every source only adds and removes entries of the WorkerPool."""

from __future__ import annotations

import asyncio
import logging
import socket

from pdserve.engine.errors import InvalidRequestError
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from router.workers import WorkerPool

log = logging.getLogger(__name__)
ROLES = ("prefill", "decode")


class DnsDiscovery:
    """Every address NAME resolves to is a worker of `role`; re-resolved every refresh_s."""

    def __init__(self, pool: WorkerPool, role: str, target: str, refresh_s: float):
        self.pool = pool
        self.role = role
        self.name, _, port = target.rpartition(":")
        self.port = int(port)
        self.refresh_s = refresh_s
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def resolve(self) -> set[str]:
        infos = await asyncio.get_running_loop().getaddrinfo(self.name, self.port, type=socket.SOCK_STREAM)
        return {_address(info[4][0], self.port) for info in infos}

    async def _run(self) -> None:
        while True:
            try:
                self.pool.sync(self.role, await self.resolve(), source=f"dns:{self.name}")
            except OSError as exc:
                log.warning("cannot resolve %s: %s", self.name, exc)
            await asyncio.sleep(self.refresh_s)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class RegistryServicer(worker_pb2_grpc.RegistryServicer):
    """Workers started with --register-with call Register as a heartbeat."""

    def __init__(self, pool: WorkerPool, heartbeat_s: float = 2.0):
        self.pool = pool
        self.heartbeat_s = heartbeat_s

    async def Register(self, request: wpb.RegisterRequest, context) -> wpb.RegisterResponse:
        if request.role not in ROLES or not request.address:
            raise InvalidRequestError(f"register needs an address and a role in {ROLES}")
        self.pool.add(request.address, request.role, source="registry")
        return wpb.RegisterResponse(heartbeat_s=self.heartbeat_s)
