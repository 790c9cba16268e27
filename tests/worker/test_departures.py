"""A decoding request leaves one decode worker with its KV and goes on in another (Depart, then
MoveKV): real engines on the tiny model, the in-process transport. The tokens are those of a run
that never moved; a refused or failed move, and a KV nobody comes for, give every block back."""

from __future__ import annotations

import asyncio

import pytest

from decode_service.departures import Departures
from decode_service.worker import DecodeJob, DecodeWorker
from pdserve.errors import InvalidRequestError
from pdserve.parallel.kv_ranks import RanksSender
from pdserve.requests import Priority, SamplingParams
from pdserve.transfer import InProcessFabric, make_transport
from pdserve.worker.events import Departed, Finished, Reserved, Tokens
from pdserve.worker.kv_out import Target
from pdserve.worker.leases import LeaseKind, Leases, Reclaim
from tests.helpers.waiting import async_wait_until
from tests.worker.pair import BLOCK, LocalPeer, make_pair, settle, start_engine

pytestmark = pytest.mark.timeout(120)

PROMPT = tuple(range(5, 35))  # 30 tokens: 8 blocks of 4, the last one partial
LONG = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


class Fleet:
    """A prefill worker and decode worker A (tests/worker/pair.py), and decode worker B, which A's
    requests move to."""

    def __init__(self, pair, b: DecodeWorker, b_engine, b_receiver):
        self.pair, self.b, self.b_engine, self.b_receiver = pair, b, b_engine, b_receiver

    @property
    def a(self) -> DecodeWorker:
        return self.pair.decode

    def target_in_b(self, reserved: Reserved) -> Target:
        kv = self.b_engine.engine.kv
        return Target(reserved.transfer_id, self.b_receiver.address(), reserved.block_ids, BLOCK, kv.block_nbytes,
                      "decode:b", reserved.secret, kv.num_blocks, reserved.cached_blocks)

    async def stop(self) -> None:
        await self.b_receiver.close()
        self.b_engine.stop()
        await self.pair.stop()

    async def engines_idle(self) -> tuple[int, int, int]:
        return (await settle(self.pair.prefill_engine), await settle(self.pair.decode_engine),
                await settle(self.b_engine))


async def _fleet(loaded) -> Fleet:
    pair = await make_pair(loaded)
    fabric = InProcessFabric()
    transport = make_transport("inprocess", fabric=fabric)
    b_engine = start_engine(loaded, hold_blocks=False)
    b_receiver = transport.receiver(b_engine.engine.kv.data)
    b = DecodeWorker(b_engine, b_receiver, Leases())
    a_engine = pair.decode_engine
    sender = RanksSender.alone(transport.sender(a_engine.engine.kv.data), a_engine.engine.kv.shape.num_kv_heads)
    pair.decode.departures = Departures(a_engine, sender, LocalPeer(b), BLOCK, a_engine.engine.kv.block_nbytes,
                                        pair.decode.leases)
    return Fleet(pair, b, b_engine, b_receiver)


async def _decode_on_a_then_depart(fleet: Fleet, request_id: str, after: int, keep_s: float | None = 10.0):
    """The request prefilled into A and decoded there until `after` tokens are out; then it
    departs. Returns its tokens (the first included) and A's answer."""
    pair = fleet.pair
    session = await fleet.a.open(pair.job(request_id, PROMPT, LONG))
    events = session.events()
    try:
        reserved = await anext(events)
        p_session = await pair.prefill.open(request_id, PROMPT, LONG, Priority.NORMAL, pair.target(reserved), 10.0)
        first = [e.token_id async for e in p_session.events() if hasattr(e, "token_id")]
        pair.prefill.live.close(p_session)
        tokens = list(first)
        departure = None
        async for event in events:
            if isinstance(event, Tokens):
                tokens.extend(event.token_ids)
                if len(tokens) >= after and departure is None:
                    departure = await fleet.a.depart(request_id, keep_s)
            elif isinstance(event, Departed):
                assert event.generated == len(tokens)
                break
        return tokens, departure
    finally:
        fleet.a.live.close(session)


async def _continue_on_b(fleet: Fleet, request_id: str, tokens: list[int], move_from: str) -> list[int]:
    job = DecodeJob(request_id, PROMPT, LONG, Priority.NORMAL, 10.0, False, tuple(tokens[:-1]))
    session = await fleet.b.open(job)
    events = session.events()
    try:
        reserved = await anext(events)
        moved = await fleet.a.move_kv(move_from, fleet.target_in_b(reserved))
        assert moved.kv_blocks == len(reserved.block_ids) - reserved.cached_blocks and moved.kv_bytes > 0
        rest = []
        async for event in events:
            if isinstance(event, Tokens):
                rest.extend(event.token_ids)
            elif isinstance(event, Finished):
                break
        return tokens + rest
    finally:
        fleet.b.live.close(session)


def test_a_request_moves_with_its_kv_and_its_tokens_stay_exact(tiny_llama):
    async def main():
        fleet = await _fleet(tiny_llama)
        try:
            reference = await fleet.pair.serve("ref", PROMPT, LONG)
            tokens, departure = await _decode_on_a_then_depart(fleet, "r", after=9)
            assert departure.departed and departure.kv_kept and departure.generated == len(tokens)
            assert len(fleet.a.departures) == 1 and fleet.a.in_flight() == 1  # a drain waits for the move
            moved = await _continue_on_b(fleet, "r", tokens, "r")
            return [reference.first_token, *reference.tokens], moved, len(fleet.a.departures), \
                await fleet.engines_idle()
        finally:
            await fleet.stop()

    reference, moved, waiting, idle = asyncio.run(main())
    assert moved == reference and waiting == 0 and idle == (0, 0, 0)


def test_depart_is_refused_unless_the_request_is_decoding(tiny_llama):
    async def main():
        fleet = await _fleet(tiny_llama)
        try:
            unknown = await fleet.a.depart("nobody", 10.0)
            session = await fleet.a.open(fleet.pair.job("waiting", PROMPT, LONG))
            events = session.events()
            await anext(events)  # reserved: no KV has arrived yet
            arriving = await fleet.a.depart("waiting", 10.0)
            fleet.a.live.close(session)
            return unknown, arriving, await fleet.engines_idle()
        finally:
            await fleet.stop()

    unknown, arriving, idle = asyncio.run(main())
    assert not unknown.departed and "no request" in unknown.reason
    assert not arriving.departed and "arriving" in arriving.reason
    assert idle == (0, 0, 0)


def test_kept_kv_nobody_moves_is_given_back_and_a_late_move_is_refused(tiny_llama):
    async def main():
        fleet = await _fleet(tiny_llama)
        try:
            tokens, departure = await _decode_on_a_then_depart(fleet, "r", after=3, keep_s=0.2)
            await async_wait_until(lambda: fleet.a.leases.ends[LeaseKind.HOLD, Reclaim.EXPIRED], 30,
                                   "the kept KV given back when its keep time passed")
            expired = fleet.a.leases.ends[LeaseKind.HOLD, Reclaim.EXPIRED]
            with pytest.raises(InvalidRequestError, match="departed"):
                await _continue_on_b(fleet, "r", tokens, "r")
            return departure.departed, expired, await fleet.engines_idle()
        finally:
            await fleet.stop()

    assert asyncio.run(main()) == (True, 1, (0, 0, 0))


def test_a_move_into_a_reservation_that_does_not_fit_is_refused_and_frees_the_kv(tiny_llama):
    async def main():
        fleet = await _fleet(tiny_llama)
        try:
            tokens, _ = await _decode_on_a_then_depart(fleet, "r", after=5)
            session = await fleet.b.open(DecodeJob("r", PROMPT, LONG, Priority.NORMAL, 10.0, False, tuple(tokens[:-1])))
            reserved = await anext(session.events())
            target = fleet.target_in_b(reserved)
            short = Target(target.transfer_id, target.kv_address, target.block_ids[:-1], BLOCK,  # a block short
                           target.block_nbytes, target.decode_endpoint, target.secret, target.num_blocks)
            with pytest.raises(InvalidRequestError):
                await fleet.a.move_kv("r", short)
            fleet.b.live.close(session)
            return len(fleet.a.departures), await fleet.engines_idle()
        finally:
            await fleet.stop()

    assert asyncio.run(main()) == (0, (0, 0, 0))


def test_without_keep_the_kv_is_given_back_at_once(tiny_llama):
    async def main():
        fleet = await _fleet(tiny_llama)
        try:
            _, departure = await _decode_on_a_then_depart(fleet, "r", after=4, keep_s=None)
            return departure.departed, departure.kv_kept, len(fleet.a.departures), await fleet.engines_idle()
        finally:
            await fleet.stop()

    assert asyncio.run(main()) == (True, False, 0, (0, 0, 0))


def test_a_depart_cancelled_while_the_engine_answers_still_completes_and_leaks_nothing(tiny_llama):
    """The router's Depart timed out while the engine was letting the request go: the departure
    happens all the same (its stream ends Departed, its KV kept), and the kept KV comes back once
    nobody moves it."""
    async def main():
        fleet = await _fleet(tiny_llama)
        pair = fleet.pair
        try:
            session = await fleet.a.open(pair.job("r", PROMPT, LONG))
            events = session.events()
            reserved = await anext(events)
            p_session = await pair.prefill.open("r", PROMPT, LONG, Priority.NORMAL, pair.target(reserved), 10.0)
            [e async for e in p_session.events()]
            pair.prefill.live.close(p_session)
            first = await anext(events)  # decoding
            asking = asyncio.ensure_future(fleet.a.depart("r", 0.3))
            await asyncio.sleep(0)
            asking.cancel()  # the caller gives up at once; the engine still answers
            seen = [first]
            async for event in events:
                seen.append(event)
            fleet.a.live.close(session)
            departed = seen[-1]
            kept = len(fleet.a.departures)
            await async_wait_until(lambda: not fleet.a.departures, 30, "the keep time passed: the KV back")
            return departed, kept, len(fleet.a.departures), await fleet.engines_idle()
        finally:
            await fleet.stop()

    departed, kept, left, idle = asyncio.run(main())
    assert isinstance(departed, Departed) and departed.kv_kept and kept == 1
    assert (left, idle) == (0, (0, 0, 0))
