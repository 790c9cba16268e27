"""A request decoding on a worker that leaves (draining, changing role) departs for another decode
worker: its KV moves there (the default), or it is prefilled again, or it finishes where it is.
Outputs stay exact; a kill, stall or cancel at any step of the move loses nothing, charges whom
it should, and every worker ends with no block taken."""

from __future__ import annotations

import asyncio
import functools

import pytest

from router.flow.flow_types import Milestone, NewTokens, OnLeave
from tests.helpers.waiting import async_wait_until
from tests.router.fake_workers import Mode, Trigger
from tests.router.flow_harness import expected, harness, job, settle

pytestmark = pytest.mark.timeout(60)
LONG = 48  # tokens: long enough to be caught decoding
DECODE3 = ("d0", "d1", "d2")


def _run(test):
    return functools.wraps(test)(lambda: asyncio.run(test()))


async def _drive(h, j, events: list | None = None) -> tuple[list[int], list[Milestone]]:
    tokens, milestones = [], []
    async for event in h.flow.run(j):
        if isinstance(event, NewTokens):
            tokens.extend(event.token_ids)
        elif isinstance(event, Milestone):
            milestones.append(event)
            if events is not None:
                events.append(event)
    return tokens, milestones


async def _decoding_on_d0(h, others=("d1",)) -> asyncio.Task:
    """The request starts on d0 (the others drain meanwhile, so they take nothing), decodes a few
    tokens there slowly, then d0 drains and the others come back."""
    d0 = h.fleet.workers["d0"]
    d0.slow = 8.0
    for d in others:
        h.fleet.workers[d].draining = True
    await h.pool.refresh()
    running = asyncio.ensure_future(_drive(h, job(max_tokens=LONG)))
    while not any(s.written or (s.received is not None and s.received.done()) for s in d0.sessions.values()):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    for d in others:
        h.fleet.workers[d].draining = False
    d0.draining = True
    return running


def _names(milestones: list[Milestone]) -> list[str]:
    return [m.name for m in milestones]


def _placements(milestones: list[Milestone]) -> list[str]:
    return [m.attributes["pdserve.decode_worker"] for m in milestones if m.name == "placement"]


@_run
async def test_a_request_departs_a_draining_worker_and_its_kv_moves():
    async with harness() as h:
        tokens, milestones = await asyncio.wait_for(await _decoding_on_d0(h), 20)
        assert tokens == expected(max_tokens=LONG)
        names = _names(milestones)
        assert names.index("departed") < names.index("kv_move")
        assert "placement.prefill" not in names[names.index("departed"):]  # nothing prefilled again
        assert _placements(milestones) == ["d0", "d1"]
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_a_departing_request_can_be_prefilled_again_instead():
    async with harness(on_leave=OnLeave.PREFILL) as h:
        tokens, milestones = await asyncio.wait_for(await _decoding_on_d0(h), 20)
        assert tokens == expected(max_tokens=LONG)
        names = _names(milestones)
        assert "kv_move" not in names and "placement.prefill" in names[names.index("departed"):]
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_with_finish_or_nowhere_to_go_it_finishes_where_it_is():
    async with harness(on_leave=OnLeave.FINISH) as h:
        tokens, milestones = await asyncio.wait_for(await _decoding_on_d0(h), 20)
        assert tokens == expected(max_tokens=LONG) and "departed" not in _names(milestones)
    async with harness() as h:
        running = await _decoding_on_d0(h)
        h.fleet.workers["d1"].kill()
        tokens, milestones = await asyncio.wait_for(running, 20)
        assert tokens == expected(max_tokens=LONG) and "departed" not in _names(milestones)
        assert set((await settle(h.fleet)).values()) == {0}


@pytest.mark.parametrize("mode", [Mode.KILL, Mode.STALL])
def test_the_departed_worker_killed_or_stalled_during_the_move(mode):
    async def body():
        async with harness() as h:
            h.fleet.triggers.append(Trigger("d0", "move", mode, seconds=1.0))
            tokens, milestones = await asyncio.wait_for(await _decoding_on_d0(h), 20)
            assert tokens == expected(max_tokens=LONG)
            names = _names(milestones)
            assert "kv_move" not in names and "resume" in names  # prefilled again instead
            resume = next(m for m in milestones if m.name == "resume")
            assert resume.attributes["pdserve.fault_kind"] == "gone"  # found gone: charged to d0
            assert set((await settle(h.fleet)).values()) == {0}

    asyncio.run(body())


@_run
async def test_the_new_worker_killed_during_the_move():
    async with harness(decode=DECODE3) as h:
        h.fleet.triggers.append(Trigger("d1", "reserved", Mode.KILL))
        running = await _decoding_on_d0(h, others=("d1",))
        h.fleet.workers["d2"].draining = True  # d1 is the target; d2 takes the resume after the kill
        while not h.fleet.workers["d1"].killed:
            await asyncio.sleep(0.01)
        h.fleet.workers["d2"].draining = False
        tokens, milestones = await asyncio.wait_for(running, 20)
        assert tokens == expected(max_tokens=LONG)
        assert "resume" in _names(milestones)
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_a_cancel_during_the_move_leaves_nothing_behind():
    async with harness() as h:
        events: list[Milestone] = []
        d0 = h.fleet.workers["d0"]
        d0.slow = 8.0
        h.fleet.workers["d1"].draining = True
        await h.pool.refresh()
        running = asyncio.ensure_future(_drive(h, job(max_tokens=LONG), events))
        while not any(s.received is not None and s.received.done() for s in d0.sessions.values()):
            await asyncio.sleep(0.01)
        h.fleet.workers["d1"].reserving.clear()  # the move waits for d1's reservation
        h.fleet.workers["d1"].draining, d0.draining = False, True
        while "departed" not in _names(events):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert set((await settle(h.fleet)).values()) == {0}  # d1's reservation and d0's kept KV both given back


async def _decoding_on_d0_under_pressure(h) -> asyncio.Task:
    """The request decodes on d0 (d1 drains meanwhile), then d0 reports requests waiting for blocks
    and d1 comes back with room."""
    d0, d1 = h.fleet.workers["d0"], h.fleet.workers["d1"]
    d0.slow, d1.draining = 8.0, True
    await h.pool.refresh()
    running = asyncio.ensure_future(_drive(h, job(max_tokens=LONG)))
    while not any(s.received is not None and s.received.done() for s in d0.sessions.values()):
        await asyncio.sleep(0.01)
    d1.draining, d0.waiting = False, 2
    return running


@_run
async def test_a_request_leaves_a_worker_where_requests_wait_for_blocks_once():
    async with harness() as h:
        tokens, milestones = await asyncio.wait_for(await _decoding_on_d0_under_pressure(h), 20)
        assert tokens == expected(max_tokens=LONG)
        assert _names(milestones).count("kv_move") == 1 and _placements(milestones) == ["d0", "d1"]
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_a_resume_goes_back_to_the_worker_it_left_for_pressure_not_to_the_one_that_died():
    """The request left d0 for d1 (rebalancing: not a fault), then d1 dies under it while the pool
    still counts d1 usable (its polls stopped: none saw the death) and roomier than d0. Both are
    workers it left; the one it failed on comes last, so the resume goes to d0 at once, not to the
    dead d1 again."""
    async with harness() as h:
        events: list[Milestone] = []
        d0, d1 = h.fleet.workers["d0"], h.fleet.workers["d1"]
        d0.slow, d1.slow, d1.draining = 8.0, 8.0, True
        await h.pool.refresh()
        running = asyncio.ensure_future(_drive(h, job(max_tokens=LONG), events))
        await async_wait_until(lambda: any(s.received is not None and s.received.done()
                                           for s in d0.sessions.values()), 20, "decoding on d0")
        d1.draining, d0.waiting = False, 2
        await async_wait_until(lambda: "kv_move" in _names(events), 20, "moved to d1")
        await h.pool.stop()
        h.pool.workers["d0"].free_blocks = 0  # by its last poll, d0 is full and d1 is not: load alone picks d1
        d1.kill()
        tokens, milestones = await asyncio.wait_for(running, 20)
        assert tokens == expected(max_tokens=LONG)
        assert _placements(milestones) == ["d0", "d1", "d0"] and _names(milestones).count("resume") == 1
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_no_rebalancing_when_switched_off_or_nowhere_roomier():
    async with harness(rebalance_interval_s=None) as h:
        tokens, milestones = await asyncio.wait_for(await _decoding_on_d0_under_pressure(h), 20)
        assert tokens == expected(max_tokens=LONG) and "departed" not in _names(milestones)
    async with harness() as h:
        h.fleet.workers["d1"].waiting = 1  # requests wait there too
        tokens, milestones = await asyncio.wait_for(await _decoding_on_d0_under_pressure(h), 20)
        assert tokens == expected(max_tokens=LONG) and "departed" not in _names(milestones)


@_run
async def test_of_many_requests_on_a_worker_under_pressure_one_leaves_per_interval():
    """Every request on the worker sees the same pressure at once: the worker's departure of the
    interval is claimed by the first that asks, before its Depart is answered, so the others stay
    (many leaving together would overfill the worker they all chose, by its last poll)."""
    async with harness(rebalance_interval_s=60.0) as h:
        d0, d1 = h.fleet.workers["d0"], h.fleet.workers["d1"]
        d0.slow, d1.draining = 8.0, True
        await h.pool.refresh()
        jobs = [job(f"r{i}", max_tokens=LONG) for i in range(6)]
        running = [asyncio.ensure_future(_drive(h, j)) for j in jobs]
        await async_wait_until(lambda: sum(s.received is not None and s.received.done()
                                           for s in d0.sessions.values()) == len(jobs), 20, "all decoding on d0")
        d1.draining, d0.waiting = False, 2
        results = await asyncio.wait_for(asyncio.gather(*running), 30)
        assert all(tokens == expected(max_tokens=LONG) for tokens, _ in results)
        assert sum(_names(milestones).count("departed") for _, milestones in results) == 1
        assert set((await settle(h.fleet)).values()) == {0}
