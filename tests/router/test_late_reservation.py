"""Decode blocks reserved when the prefill starts (FlowConfig.reserve_at PREFILL): a prompt
queued on the prefill workers holds no decode blocks; once its prefill worker starts it, its KV
waits there while a decode worker reserves. A fault, a cancel or a move at each of those points
ends with the full output (or a clear status) and no fake worker holding a block."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from pdserve.aborts import AbortScope
from router.flow.flow_types import ReserveAt
from tests.router.fake_fleet import FakePrefillClient
from tests.helpers.waiting import async_wait_until
from tests.router.fake_workers import HELD_POINT, PREFILL_POINTS, Mode, Trigger
from tests.router.flow_harness import collect, expected, harness, job, settle

pytestmark = pytest.mark.timeout(60)

LATE = ReserveAt.PREFILL


def _sessions(h, role: str) -> int:
    return sum(len(w.sessions) for w in h.fleet.workers.values() if w.role == role)


def test_a_prompt_queued_on_the_prefill_workers_holds_no_decode_blocks():
    async def main():
        async with harness(reserve_at=LATE) as h:
            for p in ("p0", "p1"):
                h.fleet.workers[p].reserving.clear()  # every prefill queued
            task = asyncio.ensure_future(collect(h.flow, job()))
            await async_wait_until(lambda: _sessions(h, "prefill") == 1, 5.0, "the prefill opened")
            await asyncio.sleep(0.1)
            assert _sessions(h, "decode") == 0 and not any(h.fleet.workers[d].opened for d in ("d0", "d1"))
            for p in ("p0", "p1"):
                h.fleet.workers[p].reserving.set()
            tokens, done, milestones = await task
            assert tokens == expected() and done is not None
            assert milestones.index("prefill.chunk") < milestones.index("placement") < milestones.index("reserved")
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())


def test_arrival_reservations_open_the_decode_call_first():
    async def main():
        async with harness(reserve_at=ReserveAt.ARRIVAL) as h:
            tokens, _, milestones = await collect(h.flow, job())
            assert tokens == expected() and "reserved" not in milestones
            assert milestones.index("placement") < milestones.index("prefill.chunk")

    asyncio.run(main())


def test_a_prefill_worker_that_takes_no_late_reservation_is_given_one_at_arrival():
    async def main():
        async with harness(prefill=("p0",), reserve_at=LATE) as h:
            worker = h.pool.workers["p0"]
            take = worker.take
            worker.take = lambda snapshot: (take(snapshot), setattr(worker, "target_follows", False))
            worker.target_follows = False
            tokens, _, milestones = await collect(h.flow, job())
            assert tokens == expected() and "reserved" not in milestones

    asyncio.run(main())


def _held(h) -> bool:
    """A prefill worker holds a prompt's KV (every chunk computed) for a reservation not come yet."""
    return any(w.snapshot().awaiting_target for w in h.fleet.workers.values() if w.role == "prefill")


HELD_CASES = ([("p0", HELD_POINT, m) for m in (Mode.KILL, Mode.STALL, Mode.FAIL, Mode.SLOW)]
              + [("d0", "open", m) for m in (Mode.KILL, Mode.STALL, Mode.FAIL)]
              + [("d0", "reserved", m) for m in (Mode.KILL, Mode.FAIL)])


@pytest.mark.parametrize("address,point,mode", HELD_CASES, ids=[f"{a}-{p}-{m.value}" for a, p, m in HELD_CASES])
def test_a_fault_while_the_prefill_holds_the_kv_ends_with_the_full_output_and_no_block_held(address, point, mode):
    """The decode workers' reservations wait (queued) until the prefill has computed the whole
    prompt, so the prefill worker holds it all when the fault comes."""
    async def main():
        async with harness(reserve_at=LATE) as h:
            for w in h.pool.workers.values():
                if w.role == "decode" and w.address != "d0":
                    w.assigned, w.running = 1, 9  # d0 first
            for d in ("d0", "d1"):
                h.fleet.workers[d].reserving.clear()
            h.fleet.triggers.append(Trigger(address, point, mode, seconds=0.6))
            task = asyncio.ensure_future(collect(h.flow, job()))
            await async_wait_until(lambda: _held(h) or task.done(), 5.0, "a prefill holding its KV")
            await asyncio.sleep(0.05)
            for d in ("d0", "d1"):
                h.fleet.workers[d].reserving.set()
            tokens, done, milestones = await task
            assert tokens == expected() and done is not None, milestones
            assert h.fleet.triggers[0].fired
            if mode in (Mode.KILL, Mode.STALL, Mode.FAIL):
                assert {"retry", "resume", "complete"} & set(milestones)
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())


def test_a_request_cancelled_while_queued_started_or_held_leaves_no_block():
    async def main():
        async with harness(reserve_at=LATE) as h:
            for d in ("d0", "d1"):
                h.fleet.workers[d].reserving.clear()  # held on the prefill worker from its first chunk on
            for delay in (0.0, 0.002, 0.005, 0.01, 0.03, 0.08):
                task = asyncio.ensure_future(collect(h.flow, job(f"c{delay}")))
                await asyncio.sleep(delay)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for d in ("d0", "d1"):
                h.fleet.workers[d].reserving.set()
            assert not any((await settle(h.fleet)).values())
            assert all(w.snapshot().awaiting_target == 0 for w in h.fleet.workers.values() if w.role == "prefill")

    asyncio.run(main())


def test_a_request_queued_for_decode_blocks_while_its_kv_is_held_moves_to_a_decode_worker_with_room():
    async def main():
        async with harness(move_after_s=0.2, move_check_s=0.05, reserve_at=LATE) as h:
            for w in h.pool.workers.values():
                if w.address == "d1":
                    w.assigned, w.running = 1, 9  # d0 first
            h.fleet.workers["d0"].reserving.clear()  # d0 keeps it queued for blocks
            h.fleet.workers["d0"].waiting = 3
            tokens, done, milestones = await collect(h.flow, job())
            h.fleet.workers["d0"].reserving.set()
            assert tokens == expected() and done is not None
            assert "moved" in milestones
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())


EVERY_POINT = [("p0", p, m) for p in PREFILL_POINTS for m in (Mode.KILL, Mode.STALL, Mode.FAIL, Mode.PARTITION)]


@pytest.mark.parametrize("address,point,mode", EVERY_POINT, ids=[f"{a}-{p}-{m.value}" for a, p, m in EVERY_POINT])
def test_reserved_late_a_prefill_fault_at_every_point_ends_with_the_full_output(address, point, mode):
    async def main():
        async with harness(reserve_at=LATE) as h:
            for w in h.pool.workers.values():
                if w.role == "prefill" and w.address != address:
                    w.assigned, w.running = 1, 9
            h.fleet.triggers.append(Trigger(address, point, mode, seconds=0.6))
            tokens, done, milestones = await collect(h.flow, job())
            assert h.fleet.triggers[0].fired
            assert tokens == expected() and done is not None, milestones
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())


def test_an_abort_that_ends_the_prefill_just_before_its_reservation_is_handed_over_ends_the_request():
    """The client's Abort (through any router) ends the request on every worker between the
    reservation and SetTarget: SetTarget finds nothing there (LOST), and the prefill stream's own
    end says why: the request ends aborted, it is not retried."""
    async def main():
        async with harness(reserve_at=LATE) as h:
            j = job(max_tokens=500)
            original = FakePrefillClient.set_target

            async def aborted_first(self, worker_id, target, timeout_s):
                for w in h.fleet.workers.values():
                    w.abort(j.owner, AbortScope.REMEMBER)
                await original(self, worker_id, target, timeout_s)

            FakePrefillClient.set_target = aborted_first
            try:
                tokens, done, milestones = await asyncio.wait_for(collect(h.flow, j), 10)
            finally:
                FakePrefillClient.set_target = original
            assert tokens == [] and done is not None and "retry" not in milestones and "abort" in milestones
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())
