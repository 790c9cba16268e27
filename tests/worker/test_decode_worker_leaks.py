"""Every way a decode request can end gives its blocks back: KV deadlines, failed pieces, a
cancelled open, and step results of an earlier request under the same id never reach a later one."""

import asyncio

import pytest

from decode_service.worker import DecodeJob, DecodeWorker
from pdserve.engine.async_engine import AsyncEngine
from pdserve.errors import InvalidRequestError
from pdserve.requests import Priority
from pdserve.transfer import InProcessFabric, TransferTimeout, make_transport
from pdserve.worker.events import Reserved
from pdserve.worker.leases import LeaseKind, Leases, Reclaim
from tests.worker.pair import GREEDY, block_until, make_pair, settle, start_engine

pytestmark = pytest.mark.timeout(120)

PROMPT = tuple(range(5, 45))  # 40 tokens: 10 blocks of 4


async def _reserve(decode: DecodeWorker, job):
    session = await decode.open(job)
    events = session.events()
    reserved = await asyncio.wait_for(anext(events), 10)
    assert isinstance(reserved, Reserved)
    return session, events, reserved


async def _fails_with(events, kind, timeout_s=10.0):
    with pytest.raises(kind):
        await asyncio.wait_for(anext(events), timeout_s)


def test_a_kv_deadline_between_pieces_aborts_the_request_and_frees_its_reservation(tiny_llama):
    async def main():
        pair = await make_pair(tiny_llama)
        try:
            session, events, reserved = await _reserve(pair.decode, pair.job("late", PROMPT, kv_timeout_s=0.3))
            pair.decode.push_kv(reserved.transfer_id, 0, 0, (0, 1), 30.0)  # announced, never sent
            await _fails_with(events, TimeoutError)
            pair.decode.live.close(session)
            ends = pair.decode.leases.ends[LeaseKind.RESERVATION, Reclaim.EXPIRED]
            return ends, await settle(pair.decode_engine), pair.decode_engine.engine.scheduler.get("late")
        finally:
            await pair.stop()

    ends, left, request = asyncio.run(main())
    assert (ends, left, request) == (1, 0, None)


def test_a_piece_that_times_out_aborts_the_request_and_frees_its_reservation(tiny_llama):
    async def main():
        pair = await make_pair(tiny_llama)
        try:
            session, events, reserved = await _reserve(pair.decode, pair.job("slow", PROMPT))
            pair.decode.push_kv(reserved.transfer_id, 0, 0, (0, 1), 0.2)
            await _fails_with(events, TransferTimeout)
            pair.decode.live.close(session)
            return await settle(pair.decode_engine), pair.decode_engine.engine.scheduler.get("slow")
        finally:
            await pair.stop()

    assert asyncio.run(main()) == (0, None)


def test_an_open_cancelled_after_the_engine_added_the_request_aborts_it(tiny_llama):
    async def main():
        pair = await make_pair(tiny_llama)
        try:
            task = asyncio.ensure_future(pair.decode.open(pair.job("cut", PROMPT)))
            await asyncio.sleep(0)  # open() queued its add and waits for it
            # NOTE: blocks the loop: the engine adds and reserves, the reply waits here
            block_until(pair.decode_engine, lambda e: e.scheduler.kv.has_blocks("cut"))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return await settle(pair.decode_engine), pair.decode_engine.engine.scheduler.get("cut"), \
                len(pair.decode.live)
        finally:
            await pair.stop()

    assert asyncio.run(main()) == (0, None, 0)


def test_a_reservation_of_an_earlier_request_never_reaches_a_later_one_with_its_id(tiny_llama):
    """Step results reach the loop late (a busy loop); meanwhile the first request closed and a
    second one opened under the same id. The second gets its own reservation, once."""

    async def main():
        engine = start_engine(tiny_llama, hold_blocks=False)
        _deliver_late(engine, 0.3)
        receiver = make_transport("inprocess", fabric=InProcessFabric()).receiver(engine.engine.kv.data)
        decode = DecodeWorker(engine, receiver, Leases())
        try:
            first = await decode.open(_job("same", PROMPT))
            block_until(engine, lambda e: e.scheduler.kv.has_blocks("same"))  # reserved; the loop hears of it later
            decode.live.close(first)
            second = await decode.open(_job("same", PROMPT[:8]))
            events = second.events()
            reserved = await asyncio.wait_for(anext(events), 10)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(events), 0.8)
            decode.live.close(second)
            return reserved, await settle(engine)
        finally:
            await receiver.close()
            engine.stop()

    reserved, left = asyncio.run(main())
    assert isinstance(reserved, Reserved) and len(reserved.block_ids) == 2
    assert left == 0


def test_pieces_are_routed_by_transfer_id_only(tiny_llama):
    """Request ids may hold anything; a transfer of an earlier request under the same id is refused."""

    async def main():
        pair = await make_pair(tiny_llama)
        try:
            session, _, old = await _reserve(pair.decode, pair.job("a#0", PROMPT))
            pair.decode.live.close(session)
            session, _, new = await _reserve(pair.decode, pair.job("a#0", PROMPT))
            with pytest.raises(InvalidRequestError, match="no transfer"):
                pair.decode.push_kv(old.transfer_id, 0, 0, (0, 1), 5.0)
            with pytest.raises(InvalidRequestError, match="no transfer"):
                pair.decode.push_kv("a", 0, 0, (0, 1), 5.0)
            pair.decode.push_kv(new.transfer_id, 0, 0, (0, 1), 5.0)
            routed = set(pair.decode.intakes) == {new.transfer_id}
            pair.decode.live.close(session)
            return routed, await settle(pair.decode_engine)
        finally:
            await pair.stop()

    assert asyncio.run(main()) == (True, 0)


def _deliver_late(engine: AsyncEngine, delay_s: float) -> None:
    """Step listeners added from now on hear of each step delay_s after it."""
    add = engine.add_listener

    def late(listener):
        add(lambda result: asyncio.get_running_loop().call_later(delay_s, listener, result))

    engine.add_listener = late


def _job(request_id: str, prompt: tuple[int, ...]) -> DecodeJob:
    return DecodeJob(request_id, prompt, GREEDY, Priority.NORMAL, 10.0, False)
