"""A RequestFlow over a FakeFleet: 2 prefill + 2 decode fake workers, fast health polls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from pdserve.admission import AdmissionPolicy
from pdserve.requests import Priority, SamplingParams
from tests.router.fake_fleet import FakeFleet, RouterLink
from tests.router.fake_workers import FleetConfig, token_at
from router.flow.flow import RequestFlow
from router.flow.flow_types import Done, FlowConfig, Job, NewTokens
from router.flow.recovery import RecoveryPolicy
from router.fleet.workers import PoolConfig, WorkerPool

PREFILL = ("p0", "p1")
DECODE = ("d0", "d1")
PROMPT = tuple(range(1, 41))
MAX_TOKENS = 8


@dataclass
class Harness:
    fleet: FakeFleet
    pool: WorkerPool
    flow: RequestFlow
    incompatible: list[str]  # workers the pool found serving another model, in order


@asynccontextmanager
async def harness(prefill=PREFILL, decode=DECODE, identities=None, model=None, **flow_kw):
    """`identities`: address -> what that fake worker's Stats say it serves; `model`: the router's."""
    fleet = FakeFleet(FleetConfig())
    for a in prefill:
        fleet.add(a, "prefill")
    for a in decode:
        fleet.add(a, "decode")
    for a, identity in (identities or {}).items():
        fleet.workers[a].identity = identity
    incompatible: list[str] = []
    pool = WorkerPool(fleet, list(prefill), list(decode), PoolConfig(poll_s=0.02, poll_timeout_s=0.05), model=model,
                      on_incompatible=lambda w: incompatible.append(w.address))
    await pool.refresh()
    pool.start()
    moves = {k: flow_kw.pop(k) for k in ("move_after_s", "move_check_s", "max_moves", "on_leave", "rebalance_interval_s",
                                         "reserve_at", "gather_tokens") if k in flow_kw}
    config = FlowConfig(kv_timeout_s=1.0, wait_for_worker_s=flow_kw.pop("wait_for_worker_s", 2.0),
                        admission=flow_kw.pop("admission", AdmissionPolicy()), recovery=RecoveryPolicy(**flow_kw),
                        **moves)
    try:
        yield Harness(fleet, pool, RequestFlow(pool, fleet, config), incompatible)
    finally:
        await pool.stop()


@dataclass
class Router:
    """One router of a tier over a fleet: its own link (cut: it died), pool and flow."""

    link: RouterLink
    pool: WorkerPool
    flow: RequestFlow


@asynccontextmanager
async def router_of(h: Harness) -> AsyncIterator[Router]:
    """A router beside the harness's, over the same fleet, as its flow is configured."""
    link = h.fleet.link()
    roles = {role: [w.address for w in h.pool.workers.values() if w.role == role] for role in ("prefill", "decode")}
    pool = WorkerPool(link, roles["prefill"], roles["decode"], PoolConfig(poll_s=0.02, poll_timeout_s=0.05))
    await pool.refresh()
    pool.start()
    try:
        yield Router(link, pool, RequestFlow(pool, link, h.flow.config))
    finally:
        await pool.stop()


def job(request_id: str = "r", max_tokens: int = MAX_TOKENS, prompt=PROMPT, timeout_s: float | None = 10.0,
        priority: Priority = Priority.NORMAL) -> Job:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    return Job(request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0), priority,
               deadline=deadline)


def expected(prompt=PROMPT, max_tokens: int = MAX_TOKENS) -> list[int]:
    return [token_at(prompt, i) for i in range(max_tokens)]


async def collect(flow: RequestFlow, j: Job) -> tuple[list[int], Done | None, list[str]]:
    tokens, done, milestones = [], None, []
    async for event in flow.run(j):
        if isinstance(event, NewTokens):
            tokens.extend(event.token_ids)
        elif isinstance(event, Done):
            done = event
        else:
            milestones.append(event.name)
    return tokens, done, milestones


async def settle(fleet: FakeFleet, timeout_s: float = 3.0) -> dict[str, int]:
    """Until every fake worker holds no block (stalled ones first run again), or the timeout."""
    end = time.monotonic() + timeout_s
    while any(fleet.active_blocks().values()) and time.monotonic() < end:
        await asyncio.sleep(0.02)
    return fleet.active_blocks()
