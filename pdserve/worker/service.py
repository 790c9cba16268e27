"""A started worker process (prefill or decode): what both kinds hold, and how they drain and stop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from pdserve.rpc.channels import ChannelPool
from pdserve.rpc.drain import Drain
from pdserve.rpc.registration import Registration
from pdserve.rpc.server import RunningServer
from pdserve.worker.metrics_feed import MetricsFeed
from pdserve.worker.observability import Observability
from pdserve.worker.runtime import WorkerRuntime


class TransferEnd(Protocol):
    """A KV sender or receiver: closed after the server stops taking calls."""

    async def close(self) -> None: ...


@dataclass
class WorkerService:
    runtime: WorkerRuntime
    server: RunningServer
    transfer: TransferEnd | None  # the KV sender (prefill) or receiver (decode; None without UCX)
    channels: ChannelPool
    observability: Observability
    feed: MetricsFeed
    drainer: Drain
    registration: Registration
    in_flight: Callable[[], int]  # requests this worker still serves

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def metrics_port(self) -> int | None:
        return self.observability.metrics_port

    async def drain(self, timeout_s: float) -> int:
        """Stop taking work, leave the registry, wait for work in flight; how many requests were left."""
        await self.server.set_serving(False)
        self.registration.stop()
        return await self.drainer.wait_idle(self.in_flight, timeout_s)

    async def stop(self) -> None:
        self.registration.stop()
        self.feed.stop()
        await self.server.stop(1.0)
        if self.transfer is not None:
            await self.transfer.close()
        await self.channels.close()
        self.runtime.stop()
        self.observability.stop()
