"""Held prompts given back so that a queued request of a higher class can start (the policy:
pdserve/scheduler/held.py).

    open / a step while prompts are held ──soon()──> one check at a time (another asked meanwhile: again)
        engine.query: the best queued request, if it lacks blocks (Scheduler.blocked_head)
        policy.pick(held prompts, blocked) ──> give_back(job) for each: its hold released; its
        KV computed again once its reservation comes (prefill_service/worker.py, set_target)

Runs on the event loop; the query waits at most for a scheduling decision, never a forward pass.
A query does not wait for the engine's queued commands, so after a give-back the next look waits
until the engine has freed those blocks (else it would see them held still and give back more).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from pdserve.engine.async_engine import AsyncEngine
from pdserve.errors import EngineFailed
from pdserve.requests import Priority
from pdserve.scheduler.held import Held, HeldVictims

log = logging.getLogger(__name__)


class HeldJob(Protocol):
    request_id: str
    priority: Priority

    def held(self) -> Held | None:
        """What it holds while its KV waits for its reservation; None while it holds nothing so."""


class GivingBack:
    def __init__(self, engine: AsyncEngine, policy: HeldVictims, jobs: Callable[[], Iterable[HeldJob]],
                 give_back: Callable[[HeldJob], None]):
        """`jobs()`: the worker's live prefills; `give_back(job)`: release what it holds (the
        worker's mechanism)."""
        self.engine = engine
        self.policy = policy
        self.jobs = jobs
        self.give_back = give_back
        self._task: asyncio.Task | None = None
        self._again = False

    def soon(self) -> None:
        """Check now, or once the check under way is over."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.ensure_future(self._checks())

    async def _checks(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            try:
                await self._check()
            except EngineFailed:
                return

    async def _check(self) -> None:
        if not any(job.held() is not None for job in self.jobs()):
            return
        blocked = await self.engine.query(lambda e: e.scheduler.blocked_head())
        if blocked is None:
            return
        held = {h.request_id: (job, h) for job in self.jobs() if (h := job.held()) is not None}  # as of now
        chosen = self.policy.pick([h for _, h in held.values()], blocked)
        for request_id in chosen:
            job, h = held[request_id]
            log.info("prefill %s (%s) gives back its %d held blocks for a %s request lacking %d",
                     request_id, h.priority.name, h.blocks, blocked.priority.name, blocked.short)
            self.give_back(job)
        if chosen:  # the next look (a query: it does not wait for queued commands) after the engine freed them
            await self.engine.call(lambda e: None)
