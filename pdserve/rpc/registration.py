"""A worker's heartbeat to the routers it registers with (--register-with: each router's
internal port, where Registry is served behind the cluster token this worker sends)."""

from __future__ import annotations

import asyncio
import logging

import grpc

from pdserve.rpc.channels import ChannelPool
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc

log = logging.getLogger(__name__)


class Registration:
    def __init__(self, channels: ChannelPool, routers: list[str], address: str, role: str, period_s: float = 2.0,
                 identity: wpb.WorkerIdentity | None = None):
        self.channels = channels
        self.routers = routers
        self.request = wpb.RegisterRequest(address=address, role=role, identity=identity)
        self.period_s = period_s
        self._task: asyncio.Task | None = None

    def set_role(self, role: str) -> None:
        """An elastic worker changed role: heartbeats say so from now on."""
        self.request.role = role

    def start(self) -> None:
        if self.routers:
            self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        """Stop heartbeating (draining): routers drop this worker after a few missed polls."""
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            for router in self.routers:
                try:
                    stub = worker_pb2_grpc.RegistryStub(self.channels.get(router))
                    await stub.Register(self.request, timeout=2.0)
                except grpc.aio.AioRpcError as exc:
                    hint = " (not a router's --internal-port?)" if exc.code() == grpc.StatusCode.UNIMPLEMENTED else ""
                    log.warning("cannot register with %s: %s%s", router, exc.code().name, hint)
            await asyncio.sleep(self.period_s)
