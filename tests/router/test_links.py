"""A KV link that does not carry (a prefill worker cannot deliver to a decode worker) is taken out
of rotation for the pair, not for the decode worker: requests go by another prefill worker or
prefill on the decode worker itself, and the decode worker stays in rotation."""

from __future__ import annotations

import asyncio
import time

import pytest

from router.fleet.breaker import BreakerConfig, BreakerState
from router.fleet.links import Links
from tests.router.flow_harness import collect, expected, harness, job, settle

pytestmark = pytest.mark.timeout(60)

STAYS_OUT = BreakerConfig(threshold=1, cooldown_s=600.0, max_cooldown_s=600.0)  # no trial during a test


def test_one_failure_takes_the_pair_out_until_its_cooldown_then_one_trial():
    links = Links()
    assert links.allows("p", "d", 0.0)
    assert links.failed("p", "d", 0.0, "unreachable")
    assert not links.allows("p", "d", 0.5) and links.allows("q", "d", 0.5) and links.allows("p", "e", 0.5)
    assert links.out(0.5) == [("p", "d")]
    assert links.allows("p", "d", 1.0)  # half-open: one trial
    links.trial("p", "d")
    assert not links.allows("p", "d", 1.0)
    assert links.failed("p", "d", 1.1, "again")  # the trial failed: out for twice as long
    assert not links.allows("p", "d", 2.5) and links.allows("p", "d", 3.2)
    assert links.delivered("p", "d") and links.allows("p", "d", 3.2) and links.out(3.2) == []


def test_a_pair_that_cannot_carry_kv_sends_later_requests_by_the_other_prefill_worker():
    async def main():
        async with harness(prefill=("p0", "p1"), decode=("d0",)) as h:
            h.fleet.partitions.add(("p0", "d0"))
            h.pool.links = Links(STAYS_OUT)
            h.pool.workers["p1"].assigned = 5  # the first request goes by p0
            tokens, _, milestones = await collect(h.flow, job("first"))
            assert tokens == expected() and "retry" in milestones
            h.pool.workers["p1"].assigned = 0
            assert h.pool.links.out(time.monotonic()) == [("p0", "d0")]
            for i in range(6):
                h.pool.workers["p1"].assigned = 5  # p0 would be chosen, were its link in rotation
                tokens, _, milestones = await collect(h.flow, job(f"later-{i}"))
                h.pool.workers["p1"].assigned = 0
                assert tokens == expected() and "retry" not in milestones
            assert h.pool.workers["d0"].breaker.state == BreakerState.CLOSED
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())


def test_a_decode_worker_no_prefill_worker_can_reach_prefills_for_itself():
    async def main():
        async with harness(prefill=("p0",), decode=("d0",)) as h:
            h.fleet.partitions.add(("p0", "d0"))
            h.pool.links = Links(STAYS_OUT)
            tokens, _, milestones = await collect(h.flow, job("first"))
            assert tokens == expected() and "retry" in milestones
            for i in range(4):
                tokens, _, milestones = await collect(h.flow, job(f"later-{i}"))
                assert tokens == expected() and "retry" not in milestones
            assert h.pool.workers["d0"].breaker.state == BreakerState.CLOSED
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())
