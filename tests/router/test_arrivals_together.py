"""Requests that arrive together spread over the decode workers: each counts on the worker it chose
from its choice on (Placer.claim), not from its decode call's open after its prefill and admission,
so one arriving meanwhile sees it (they all went to the first worker, whose load looked the same)."""

from __future__ import annotations

import asyncio

import pytest

from tests.router.flow_harness import collect, expected, harness, job, settle

pytestmark = pytest.mark.timeout(60)


def test_requests_that_arrive_together_spread_over_the_decode_workers_and_leave_no_claim():
    async def run() -> tuple[dict[str, int], dict[str, int]]:
        async with harness() as h:
            decode = [h.fleet.workers[a] for a in ("d0", "d1")]
            for worker in decode:  # no request gets its blocks, so none ends, until all four are placed
                worker.reserving.clear()
            prompts = [tuple(range(10 * k + 1, 10 * k + 41)) for k in range(4)]
            running = asyncio.gather(*(collect(h.flow, job(f"r{k}", prompt=p)) for k, p in enumerate(prompts)))
            while sum(w.opened for w in decode) < len(prompts):
                await asyncio.sleep(0.01)
            for worker in decode:
                worker.reserving.set()
            results = await running
            assert [tokens for tokens, _, _ in results] == [expected(p) for p in prompts]
            await settle(h.fleet)
            return ({a: h.fleet.workers[a].opened for a in ("d0", "d1")},
                    {a: w.claimed + w.assigned for a, w in h.pool.workers.items()})

    opened, left = asyncio.run(run())
    assert opened == {"d0": 2, "d1": 2}
    assert set(left.values()) == {0}
