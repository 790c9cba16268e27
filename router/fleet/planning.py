"""The planner's loop in the router (`--planner`): every `period_s` it reads the pool's workers as
signals (pdserve/elastic/signals.py), asks the policy (pdserve/elastic/planner.py) and carries
out the change it names: WorkerControl.SetRole on that elastic worker, which the pool marks as
changing at once (no new work placed there). Every change is a log line, a metric
(pdserve_planner_changes_total) and a span (pdserve.planner.change).

A router that restarts mid-change loses nothing: the worker completes the change it was told
and the new router reads roles from Stats; its policy starts without history, so it waits its
`confirm` observations before changing anything itself.
"""

from __future__ import annotations

import asyncio
import logging
import time

from opentelemetry import trace

from pdserve.elastic import FleetSignals, PlannerPolicy, RoleChange, WorkerSignals
from pdserve.telemetry import Metrics
from router.fleet.clients import WorkerClients, WorkerFault
from router.fleet.workers import Worker, WorkerPool

log = logging.getLogger(__name__)


class Planner:
    def __init__(self, pool: WorkerPool, clients: WorkerClients, policy: PlannerPolicy, metrics: Metrics,
                 tracer: trace.Tracer, period_s: float = 1.0, call_timeout_s: float = 5.0):
        self.pool = pool
        self.clients = clients
        self.policy = policy
        self.metrics = metrics
        self.tracer = tracer
        self.period_s = period_s
        self.call_timeout_s = call_timeout_s
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                await self.step(time.monotonic())
            except Exception:  # the loop outlives any one observation
                log.exception("planner step failed")

    async def step(self, now: float) -> RoleChange | None:
        """One observation, and the change it led to (carried out), if any."""
        change = self.policy.observe(signals_of(self.pool), now)
        if change is None:
            return None
        worker = self.pool.workers.get(change.address)
        if worker is None:
            return None
        try:
            role, next_role = await self.clients.set_role(change.address, change.to_role, self.call_timeout_s)
        except WorkerFault as fault:
            log.warning("planner: could not move %s: %s", change.describe(), fault)
            return None
        worker.role, worker.next_role = role, next_role  # placement stops using it at once
        log.warning("planner: moving %s", change.describe())
        self.metrics.count_planner_change(change.from_role, change.to_role, change.reason)
        self.tracer.start_span("pdserve.planner.change", attributes={
            "pdserve.worker": change.address, "pdserve.from_role": change.from_role, "pdserve.to_role": change.to_role,
            "pdserve.reason": change.reason, **{f"pdserve.{k}": v for k, v in change.figures.items()}}).end()
        return change


def signals_of(pool: WorkerPool) -> FleetSignals:
    now = time.monotonic()
    return FleetSignals(tuple(_signals(w) for w in pool.workers.values() if w.usable(now) or w.next_role))


def _signals(w: Worker) -> WorkerSignals:
    return WorkerSignals(w.address, w.role, w.elastic, bool(w.next_role), w.queued_prefill_tokens + w.sent_tokens,
                         w.prefill_tokens_per_s, max(w.running, w.assigned), w.waiting, w.free_blocks,
                         w.total_blocks, w.step_s, w.awaiting_target)
