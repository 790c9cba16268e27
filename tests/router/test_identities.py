"""The router serves only workers whose model is its own, and pairs a prefill and a decode worker
only when their identities agree: an odd worker gets no work (said once), and is used again once
it serves the router's model."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from pdserve.identity import ModelFingerprint, WorkerIdentity
from tests.helpers.waiting import async_wait_until
from tests.router.flow_harness import collect, expected, harness, job, settle

pytestmark = pytest.mark.timeout(60)
MODEL = ModelFingerprint("weights", "architecture", "tokenizer")
SAME = WorkerIdentity(MODEL, "torch.float32", 4)
OTHER_WEIGHTS = dataclasses.replace(SAME, model=dataclasses.replace(MODEL, weights="other"))
OTHER_BLOCKS = dataclasses.replace(SAME, block_size=8)


def _all(**overrides) -> dict:
    return {**{a: SAME for a in ("p0", "p1", "d0", "d1")}, **overrides}


async def _serve(h, n: int = 6) -> None:
    for i in range(n):
        tokens, _, _ = await collect(h.flow, job(f"r{i}"))
        assert tokens == expected()


def test_a_decode_worker_serving_other_weights_gets_no_work_until_it_serves_the_model():
    async def main():
        async with harness(identities=_all(d1=OTHER_WEIGHTS), model=MODEL) as h:
            await h.pool.refresh()
            assert h.pool.workers["d1"].incompatible == ("weights",) and h.incompatible == ["d1"]
            await _serve(h)
            assert h.fleet.workers["d1"].opened == 0 and h.fleet.workers["d0"].opened == 6
            h.fleet.workers["d1"].identity = SAME  # restarted with the router's model
            await async_wait_until(lambda: not h.pool.workers["d1"].incompatible, 5, "d1 compatible again")
            h.pool.workers["d0"].running, h.pool.workers["d0"].assigned = 9, 1  # d1 is the lighter now
            await _serve(h, 1)
            assert h.fleet.workers["d1"].opened == 1 and h.incompatible == ["d1"]
            assert set((await settle(h.fleet)).values()) == {0}

    asyncio.run(main())


def test_a_worker_that_says_nothing_of_what_it_serves_is_not_used():
    async def main():
        async with harness(identities=_all(p1=None), model=MODEL) as h:
            await h.pool.refresh()
            assert h.pool.workers["p1"].incompatible == ("identity",)
            await _serve(h)
            assert h.fleet.workers["p1"].opened == 0

    asyncio.run(main())


def test_a_prefill_worker_is_paired_only_with_decode_workers_of_its_block_size():
    async def main():
        async with harness(identities=_all(p1=OTHER_BLOCKS, d1=OTHER_BLOCKS), model=MODEL) as h:
            await h.pool.refresh()
            assert not h.incompatible  # the same model: each serves, with its own kind
            await _serve(h, 8)
            opened = {a: w.opened for a, w in h.fleet.workers.items()}  # each request: one prefill, one decode
            assert opened["p0"] == opened["d0"] and opened["p1"] == opened["d1"]
            assert opened["p0"] + opened["p1"] == 8

    asyncio.run(main())
