"""A request queued for blocks on its decode worker moves to one that has room now (a restarted
worker included): not a fault, bounded, and it leaves nothing behind on either worker."""

from __future__ import annotations

import asyncio
import functools

import pytest

from router.flow.flow_types import Milestone, NewTokens
from tests.router.fake_workers import Mode, Trigger
from tests.router.flow_harness import expected, harness, job, settle

pytestmark = pytest.mark.timeout(60)
FAST = {"move_after_s": 0.2, "move_check_s": 0.05}


def _run(test):
    return functools.wraps(test)(lambda: asyncio.run(test()))


async def _drive(h, j) -> tuple[list[int], list[Milestone]]:
    tokens, milestones = [], []
    async for event in h.flow.run(j):
        if isinstance(event, NewTokens):
            tokens.extend(event.token_ids)
        elif isinstance(event, Milestone):
            milestones.append(event)
    return tokens, milestones


async def _queued_on_d0_while_d1_restarts(h) -> None:
    """d1 is down when the request is placed, so it lands on d0, whose reservations wait; d1
    comes back once the request is queued there."""
    d0, d1 = h.fleet.workers["d0"], h.fleet.workers["d1"]
    d0.reserving.clear()
    d0.waiting = 1
    d1.kill()
    await h.pool.refresh()
    while not d0.sessions:
        await asyncio.sleep(0.01)
    d1.restart()


@_run
async def test_a_request_queued_for_blocks_moves_to_a_restarted_worker_with_room():
    async with harness(**FAST) as h:
        moving = asyncio.ensure_future(_drive(h, job()))
        await _queued_on_d0_while_d1_restarts(h)
        tokens, milestones = await asyncio.wait_for(moving, 10)
        assert tokens == expected()
        moved = [m for m in milestones if m.name == "moved"]
        assert len(moved) == 1 and (moved[0].attributes["pdserve.from"], moved[0].attributes["pdserve.to"]) == (
            "d0", "d1")
        placements = [m.attributes["pdserve.decode_worker"] for m in milestones if m.name == "placement"]
        assert placements == ["d0", "d1"]
        assert set((await settle(h.fleet)).values()) == {0}  # its place in d0's queue was given back


@_run
async def test_nothing_moves_without_a_worker_that_has_room():
    async with harness(**FAST) as h:
        for d in ("d0", "d1"):
            h.fleet.workers[d].reserving.clear()
            h.fleet.workers[d].waiting = 3
        await h.pool.refresh()
        running = asyncio.ensure_future(_drive(h, job()))
        await asyncio.sleep(0.6)  # three times move_after_s: everyone is queued, so it stays
        for d in ("d0", "d1"):
            h.fleet.workers[d].reserving.set()
        tokens, milestones = await asyncio.wait_for(running, 10)
        assert tokens == expected() and not [m for m in milestones if m.name == "moved"]
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_moves_are_bounded():
    """Queued on d0 while d1 has room, it moves; then d1 queues it while d0 has room: with
    max_moves 1 it stays."""
    async with harness(max_moves=1, **FAST) as h:
        d0, d1 = h.fleet.workers["d0"], h.fleet.workers["d1"]
        for d in (d0, d1):
            d.reserving.clear()
        running = asyncio.ensure_future(_drive(h, job()))
        await _queued_on_d0_while_d1_restarts(h)
        while not d1.sessions:
            await asyncio.sleep(0.01)
        d0.waiting, d1.waiting = 0, 1
        await asyncio.sleep(0.6)  # three times move_after_s
        for d in (d0, d1):
            d.reserving.set()
        tokens, milestones = await asyncio.wait_for(running, 10)
        assert tokens == expected()
        assert [m.attributes["pdserve.to"] for m in milestones if m.name == "moved"] == ["d1"]
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_the_target_dying_after_a_move_is_an_ordinary_retry():
    async with harness(**FAST) as h:
        h.fleet.triggers.append(Trigger("d1", "reserved", Mode.KILL))
        moving = asyncio.ensure_future(_drive(h, job()))
        await _queued_on_d0_while_d1_restarts(h)
        while not any(t.fired for t in h.fleet.triggers):
            await asyncio.sleep(0.01)
        h.fleet.workers["d0"].reserving.set()
        h.fleet.workers["d0"].waiting = 0
        tokens, milestones = await asyncio.wait_for(moving, 10)
        assert tokens == expected()
        names = [m.name for m in milestones]
        assert "moved" in names and "retry" in names
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_a_prompt_queued_on_a_busy_prefill_worker_moves_to_one_predicted_much_sooner():
    async with harness(**FAST) as h:
        p0, p1 = h.fleet.workers["p0"], h.fleet.workers["p1"]
        for w in (p0, p1):
            w.prefill_tokens_per_s = 1000.0
        p1.kill()  # so the prompt goes to p0
        await h.pool.refresh()
        p0.reserving.clear()
        p0.queued_prefill_tokens = 10_000  # 10 s of prompts ahead of it there
        moving = asyncio.ensure_future(_drive(h, job()))
        while not p0.sessions:
            await asyncio.sleep(0.01)
        p1.restart()  # idle: its first token is predicted in milliseconds
        tokens, milestones = await asyncio.wait_for(moving, 10)
        assert tokens == expected()
        moved = [m.attributes for m in milestones if m.name == "moved"]
        assert [(m["pdserve.role"], m["pdserve.from"], m["pdserve.to"]) for m in moved] == [("prefill", "p0", "p1")]
        assert set((await settle(h.fleet)).values()) == {0}  # p0 gave its queue place back; one reservation served


@_run
async def test_a_prompt_stays_where_no_prefill_worker_is_much_sooner():
    async with harness(**FAST) as h:
        p0, p1 = h.fleet.workers["p0"], h.fleet.workers["p1"]
        for w in (p0, p1):
            w.prefill_tokens_per_s, w.queued_prefill_tokens = 1000.0, 3000
        await h.pool.refresh()
        for w in (p0, p1):
            w.reserving.clear()
        running = asyncio.ensure_future(_drive(h, job()))
        await asyncio.sleep(0.6)
        for w in (p0, p1):
            w.reserving.set()
        tokens, milestones = await asyncio.wait_for(running, 10)
        assert tokens == expected() and not [m for m in milestones if m.name == "moved"]
