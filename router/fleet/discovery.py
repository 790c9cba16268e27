"""How the router learns its workers: a static list, DNS names (a headless Service), or workers
registering themselves. Every source only adds and removes entries of the WorkerPool.

Registration is served on the router's internal port only (`--internal-port`, never the public
one) and needs the cluster token there. It is capped (`--max-registered-workers`) and keyed by
address: a second Register of an address is its heartbeat. A registered worker that stops
answering its Stats polls leaves the pool, which closes the router's channel to it.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from pdserve.errors import InvalidRequestError, OverloadedError
from pdserve.rpc.bounds import check_address
from pdserve.rpc.stats import identity_from_pb
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from router.fleet.workers import WorkerPool

log = logging.getLogger(__name__)
ROLES = ("prefill", "decode")


MAX_REGISTERED_WORKERS = 256  # --max-registered-workers

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
    """Workers started with --register-with call Register as a heartbeat. At most `max_workers`
    come from here; an address keeps the role it joined with."""

    def __init__(self, pool: WorkerPool, max_workers: int = MAX_REGISTERED_WORKERS, heartbeat_s: float = 2.0):
        self.pool = pool
        self.max_workers = max_workers
        self.heartbeat_s = heartbeat_s

    async def Register(self, request: wpb.RegisterRequest, context) -> wpb.RegisterResponse:
        self.admit(request.address, request.role)
        identity = identity_from_pb(request.identity)
        if identity is not None:
            self.pool.introduce(request.address, identity)
        return wpb.RegisterResponse(heartbeat_s=self.heartbeat_s)

    def admit(self, address: str, role: str) -> None:
        """Add a worker, or take a heartbeat of one known; InvalidRequestError or OverloadedError
        (the cap) with the pool unchanged."""
        if role not in ROLES:
            raise InvalidRequestError(f"register needs a role in {ROLES}")
        check_address("address", address)
        known = self.pool.workers.get(address)
        if known is not None:
            if known.role != role:
                raise InvalidRequestError(f"{address} is a {known.role} worker here, not {role}")
            return
        if self.registered() >= self.max_workers:
            raise OverloadedError(f"{self.max_workers} workers are registered already (--max-registered-workers)")
        self.pool.add(address, role, source="registry")

    def registered(self) -> int:
        return sum(1 for w in self.pool.workers.values() if w.source == "registry")
