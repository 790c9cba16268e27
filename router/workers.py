"""The router's view of its workers: addresses, readiness and load, refreshed by polling Stats."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from pdserve.rpc.channels import ChannelPool
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc

log = logging.getLogger(__name__)


@dataclass
class Worker:
    address: str
    role: str  # "prefill" | "decode"
    ready: bool = False
    draining: bool = False
    free_blocks: int = 0
    total_blocks: int = 0
    running: int = 0
    waiting: int = 0
    assigned: int = 0  # requests this router has in flight on it (fresher than polled stats)
    source: str = "static"  # static | registry | dns:NAME
    failures: int = 0  # consecutive failed polls

    @property
    def usable(self) -> bool:
        return self.ready and not self.draining


class WorkerPool:
    def __init__(self, channels: ChannelPool, prefill: list[str], decode: list[str], poll_s: float = 0.5,
                 on_change: Callable[[], None] = lambda: None):
        self.channels = channels
        self.workers = {a: Worker(a, "prefill") for a in prefill} | {a: Worker(a, "decode") for a in decode}
        self.poll_s = poll_s
        self.on_change = on_change
        self.forget_after = 6  # failed polls before a registered worker is dropped
        self._task: asyncio.Task | None = None

    def of_role(self, role: str) -> list[Worker]:
        return [w for w in self.workers.values() if w.role == role and w.usable]

    @property
    def ready(self) -> bool:
        return bool(self.of_role("prefill")) and bool(self.of_role("decode"))

    def add(self, address: str, role: str, source: str = "static") -> None:
        if address not in self.workers:
            log.info("worker %s (%s) joined via %s", address, role, source)
            self.workers[address] = Worker(address, role, source=source)

    def remove(self, address: str) -> None:
        """Stop routing to a worker; requests already on it keep their connection."""
        if self.workers.pop(address, None) is not None:
            log.info("worker %s left", address)
            self.on_change()

    def sync(self, role: str, addresses: set[str], source: str) -> None:
        """Make the workers of one discovery source exactly `addresses`."""
        for address in addresses:
            self.add(address, role, source)
        for worker in [w for w in self.workers.values() if w.source == source and w.address not in addresses]:
            self.remove(worker.address)

    def mark_failed(self, address: str) -> None:
        worker = self.workers.get(address)
        if worker is not None and worker.ready:
            worker.ready = False
            self.on_change()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._poll_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def refresh(self) -> None:
        await asyncio.gather(*(self._poll(w) for w in list(self.workers.values())))
        self.on_change()

    async def _poll_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # a poll must never end the loop
                log.exception("worker poll failed")
            await asyncio.sleep(self.poll_s)

    async def _poll(self, worker: Worker) -> None:
        stub_cls = worker_pb2_grpc.PrefillWorkerStub if worker.role == "prefill" else worker_pb2_grpc.DecodeWorkerStub
        try:
            stats = await stub_cls(self.channels.get(worker.address)).Stats(wpb.StatsRequest(), timeout=2.0)
        except grpc.aio.AioRpcError as exc:
            worker.failures += 1
            busy = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and worker.failures < 3
            worker.ready = worker.ready and busy
            if worker.source == "registry" and worker.failures >= self.forget_after:
                self.remove(worker.address)
            return
        worker.failures = 0
        worker.ready, worker.draining = True, stats.draining
        worker.free_blocks, worker.total_blocks = stats.blocks_free + stats.blocks_cached, stats.blocks_total
        worker.running, worker.waiting = stats.requests_running, stats.requests_waiting
