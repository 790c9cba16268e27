"""The router's planner loop over the fake fleet: it changes an elastic worker's role when the
signals say so, the pool stops placing there at once, requests keep their outputs, and a router
that restarts mid-change finds the worker in the role it was told."""

from __future__ import annotations

import asyncio
import functools

import pytest
from opentelemetry import trace

from pdserve.elastic import PlannerPolicy
from pdserve.telemetry import Metrics
from router.fleet.planning import Planner
from router.fleet.workers import PoolConfig, WorkerPool
from tests.router.fake_workers import FakeSession
from tests.router.flow_harness import collect, expected, harness, job, settle

pytestmark = pytest.mark.timeout(60)


def _run(test):
    return functools.wraps(test)(lambda: asyncio.run(test()))


def _planner(h, metrics: Metrics) -> Planner:
    return Planner(h.pool, h.fleet, PlannerPolicy(confirm=2, cooldown_s=0.0), metrics, trace.get_tracer("test"))


@_run
async def test_a_prefill_backlog_turns_an_elastic_decode_worker_into_a_prefill_worker():
    async with harness(prefill=("p0",), decode=("d0", "d1")) as h:
        p0, d1 = h.fleet.workers["p0"], h.fleet.workers["d1"]
        p0.queued_prefill_tokens, p0.prefill_tokens_per_s = 8000, 1000.0  # 8 s of prompts queued
        d1.elastic = True
        await h.pool.refresh()
        metrics = Metrics()
        planner = _planner(h, metrics)
        assert await planner.step(0.0) is None  # not confirmed yet
        change = await planner.step(1.0)
        assert (change.address, change.to_role, change.reason) == ("d1", "prefill", "prefill_backlog")
        assert h.pool.workers["d1"].role == "prefill"  # it held nothing: at once
        assert metrics.planner_changes.labels(from_role="decode", to_role="prefill",
                                              reason="prefill_backlog")._value.get() == 1
        await h.pool.refresh()
        assert {w.address for w in h.pool.of_role("prefill")} == {"p0", "d1"}
        assert {w.address for w in h.pool.of_role("decode")} == {"d0"}
        tokens, done, _ = await collect(h.flow, job())
        assert tokens == expected() and done is not None
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_a_worker_changing_role_takes_no_new_work_until_it_has():
    async with harness(prefill=("p0",), decode=("d0", "d1")) as h:
        d1 = h.fleet.workers["d1"]
        d1.elastic = True
        d1.reserving.clear()
        h.fleet.workers["d0"].kill()  # so the request is d1's
        await h.pool.refresh()
        running = asyncio.ensure_future(collect(h.flow, job("held", max_tokens=4)))
        while not d1.sessions:
            await asyncio.sleep(0.01)
        assert await h.fleet.set_role("d1", "prefill", 1.0) == ("decode", "prefill")
        await h.pool.refresh()
        assert h.pool.of_role("decode") == [] and h.pool.of_role("prefill") == [h.pool.workers["p0"]]
        d1.reserving.set()
        tokens, _, _ = await asyncio.wait_for(running, 10)  # what it held finishes there
        assert tokens == expected(max_tokens=4)
        await h.pool.refresh()
        assert h.pool.workers["d1"].role == "prefill" and not h.pool.workers["d1"].next_role
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_a_router_restarted_mid_change_finds_the_worker_in_its_new_role():
    async with harness(prefill=("p0",), decode=("d0", "d1")) as h:
        d1 = h.fleet.workers["d1"]
        d1.elastic = True
        d1.sessions["busy"] = FakeSession("busy", 0)  # it holds work: the change waits for it
        assert await h.fleet.set_role("d1", "prefill", 1.0) == ("decode", "prefill")
        # the router that asked is gone; a new one starts over the same workers
        fresh = WorkerPool(h.fleet, ["p0"], ["d0", "d1"], PoolConfig(poll_s=0.02, poll_timeout_s=0.05))
        await fresh.refresh()
        assert fresh.workers["d1"].next_role == "prefill"
        assert {w.address for w in fresh.of_role("decode")} == {"d0"}
        assert {w.address for w in fresh.of_role("prefill")} == {"p0"}
        del d1.sessions["busy"]
        await fresh.refresh()
        assert fresh.workers["d1"].role == "prefill"
        assert {w.address for w in fresh.of_role("prefill")} == {"p0", "d1"}


@_run
async def test_a_request_given_back_by_a_worker_changing_role_goes_elsewhere_and_charges_nobody():
    """The router has not polled since the change began: it places on the worker, which gives the
    request back; the router retries on another and uses that worker for nothing until a poll."""
    async with harness(prefill=("p0",), decode=("d0", "d1")) as h:
        d0 = h.fleet.workers["d0"]
        d0.elastic = True
        d0.sessions["busy"] = FakeSession("busy", 0)  # it holds work: the change waits
        await h.fleet.set_role("d0", "prefill", 1.0)
        await h.pool.stop()  # no polls: the router still takes d0 for a decode worker
        events = [e async for e in h.flow.run(job())]
        tokens = [t for e in events if hasattr(e, "token_ids") for t in e.token_ids]
        assert tokens == expected()
        placements = [e.attributes["pdserve.decode_worker"] for e in events if getattr(e, "name", "") == "placement"]
        assert placements[-1] == "d1" and h.pool.workers["d0"].gave_back
        assert h.pool.workers["d0"].breaker.state.name == "CLOSED"  # not charged
        del d0.sessions["busy"]
