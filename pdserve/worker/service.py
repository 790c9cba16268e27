"""A started worker process (prefill, decode, or elastic: both, one at a time): what both kinds hold, and how they drain,
give up after their engine failed, and stop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Protocol

from pdserve.rpc.channels import ChannelPool
from pdserve.rpc.drain import Drain
from pdserve.rpc.registration import Registration
from pdserve.rpc.server import RunningServer
from pdserve.worker.metrics_feed import MetricsFeed
from pdserve.worker.observability import Observability
from pdserve.worker.runtime import WorkerRuntime

FLUSH_S = 0.5  # after an engine failure: time for failed streams to send their statuses


class TransferEnd(Protocol):
    """A KV sender or receiver: closed after the server stops taking calls."""

    async def close(self) -> None: ...


@dataclass
class WorkerService:
    runtime: WorkerRuntime
    server: RunningServer
    transfers: tuple[TransferEnd, ...]  # the KV sender (prefill), receiver (decode; none without UCX), or both
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

    def on_engine_failure(self, listener: Callable[[BaseException], None]) -> None:
        """`listener(exc)` runs on the event loop when this worker's engine died or one of its
        tensor-parallel ranks was lost."""
        self.runtime.on_failure(listener)

    async def give_up(self, flush_s: float = FLUSH_S) -> None:
        """The engine failed: leave rotation (NOT_SERVING, out of the registry) and give the
        streams that failed time to send their statuses; `stop(grace_s=0)` then cancels the rest."""
        await self.server.set_serving(False)
        self.registration.stop()
        await asyncio.sleep(flush_s)

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving (calls still running after grace_s are cancelled), then everything beneath."""
        self.registration.stop()
        self.feed.stop()
        self.drainer.stopping()
        await self.server.stop(grace_s)
        for transfer in self.transfers:
            await transfer.close()
        await self.channels.close()
        self.runtime.stop()
        self.observability.stop()
