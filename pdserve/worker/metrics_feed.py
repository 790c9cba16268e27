"""Keeps a worker's gauges current (KV blocks and usage, running and waiting requests, leases) and
counts its preemptions and prefix-cache lookups, from engine steps and stats."""

from __future__ import annotations

import asyncio
import logging

from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.outputs import StepResult
from pdserve.telemetry import Metrics
from pdserve.worker.leases import LeaseKind, Leases

log = logging.getLogger(__name__)


class MetricsFeed:
    def __init__(self, engine: AsyncEngine, metrics: Metrics, leases: Leases, period_s: float = 0.5):
        """Lease ends are counted as they happen (the feed listens to `leases`)."""
        self.engine = engine
        self.metrics = metrics
        self.leases = leases
        self.period_s = period_s
        self._task: asyncio.Task | None = None
        engine.add_listener(self.on_step)
        leases.listen(metrics.count_lease_end)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def on_step(self, result: StepResult) -> None:
        for preemption in result.preemptions:
            self.metrics.count_preemption(preemption.mode.value)
        for out in result.outputs:
            if out.finished:
                self.metrics.count_prefix_cache(out.request.num_prompt_tokens, out.request.num_cached_tokens)

    async def refresh(self) -> None:
        stats = self.engine.stats
        kv = stats.kv
        self.metrics.set_kv_blocks(free=kv.free, active=kv.active, cached=kv.cached, swapped=kv.swapped,
                                   held=kv.held, reserved=stats.blocks_reserved, quarantined=kv.quarantined)
        for kind in LeaseKind:
            self.metrics.set_leases(kind, self.leases.live(kind))
        self.metrics.set_queue_sizes(running=stats.running + stats.receiving, waiting=stats.waiting + stats.swapped)

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # never let a gauge update end the loop
                log.exception("metrics refresh failed")
            await asyncio.sleep(self.period_s)
