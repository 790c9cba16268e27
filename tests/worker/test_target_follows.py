"""A prefill opened without its reservation (target_follows): what its steps compute waits here,
held, until set_target brings the decode worker's reservation; the outcome equals a prefill
opened with it, and every way such a prefill ends gives every block back on both workers."""

import asyncio

import pytest

from pdserve.errors import IncompatibleError, InvalidRequestError
from pdserve.requests import Priority
from pdserve.rpc.errors import NotFound
from pdserve.worker.events import Chunk, FirstToken, Reserved
from pdserve.worker.leases import LeaseKind
from tests.worker.pair import GREEDY, Outcome, decoded, make_pair, settle

pytestmark = pytest.mark.timeout(120)

PROMPT = tuple(range(5, 45))  # 40 tokens: 5 chunks of 8


async def _late(pair, rid: str, prompt: tuple[int, ...], chunks_before: int) -> Outcome:
    """The router's part with the reservation taken once the prefill computed `chunks_before`
    chunks (0: before any; more than the prompt has: after the last, its KV all held)."""
    p_session = await pair.prefill.open(rid, prompt, GREEDY, Priority.NORMAL, None, 10.0)
    p_events = p_session.events()
    d_session = None
    try:
        seen = 0
        while seen < chunks_before:
            event = await anext(p_events)
            assert isinstance(event, Chunk), "no first token before the reservation"
            seen += 1
            if event.start + event.num_tokens >= len(prompt):
                break
        d_session = await pair.decode.open(pair.job(rid, prompt))
        d_events = d_session.events()
        reserved = await anext(d_events)
        assert isinstance(reserved, Reserved)
        pair.prefill.set_target(rid, pair.target(reserved))
        done = [e async for e in p_events if isinstance(e, FirstToken)]
        return await decoded(done[0].token_id, d_events)
    finally:
        pair.prefill.live.close(p_session)
        if d_session is not None:
            pair.decode.live.close(d_session)


@pytest.mark.parametrize("chunks_before", [0, 1, 3, 99])
def test_a_late_reservation_gives_the_same_tokens_and_frees_every_block(tiny_llama, chunks_before):
    async def main():
        pair = await make_pair(tiny_llama)
        try:
            expected = await pair.serve("ref", PROMPT)
            got = await _late(pair, "late", PROMPT, chunks_before)
            assert (got.first_token, got.tokens) == (expected.first_token, expected.tokens)
            assert got.finished is not None
            assert await pair.holds_nothing()
        finally:
            await pair.stop()

    asyncio.run(main())


def test_a_prefill_whose_router_leaves_while_its_kv_waits_gives_every_block_back(tiny_llama):
    async def main():
        pair = await make_pair(tiny_llama)
        try:
            session = await pair.prefill.open("r", PROMPT, GREEDY, Priority.NORMAL, None, 10.0)
            events = session.events()
            async for event in events:  # every chunk computed; no first token without a reservation
                if event.start + event.num_tokens >= len(PROMPT):
                    break
            assert pair.prefill.leases.live(LeaseKind.WAITING) == 1 and pair.prefill.awaiting_target() == 1
            assert await pair.prefill_engine.call(lambda e: e.scheduler.stats().kv.active) > 0
            pair.prefill.live.close(session)
            assert pair.prefill.leases.live(LeaseKind.WAITING) == 0
            assert await settle(pair.prefill_engine) == 0
        finally:
            await pair.stop()

    asyncio.run(main())


def test_set_target_refuses_what_it_cannot_take_and_a_bad_reservation_ends_the_prefill(tiny_llama):
    async def main():
        pair = await make_pair(tiny_llama)
        try:
            with pytest.raises(NotFound):
                pair.prefill.set_target("nobody", None)
            d_session = await pair.decode.open(pair.job("d", PROMPT))
            reserved = await anext(d_session.events())
            target = pair.target(reserved)
            opened = await pair.prefill.open("with", PROMPT, GREEDY, Priority.NORMAL, target, 10.0)
            with pytest.raises(IncompatibleError):
                pair.prefill.set_target("with", target)
            pair.prefill.live.close(opened)
            pair.decode.live.close(d_session)

            session = await pair.prefill.open("bad", PROMPT, GREEDY, Priority.NORMAL, None, 10.0)
            await anext(session.events())  # started: its first chunk's KV waits
            short = pair.target(reserved)
            short = type(short)(**{**short.__dict__, "block_ids": short.block_ids[:-1]})
            with pytest.raises(InvalidRequestError):
                pair.prefill.set_target("bad", short)
            with pytest.raises(InvalidRequestError):
                async for _ in session.events():
                    pass
            pair.prefill.live.close(session)
            assert pair.prefill.leases.live(LeaseKind.WAITING) == 0
            assert await settle(pair.prefill_engine) == 0 and await settle(pair.decode_engine) == 0
        finally:
            await pair.stop()

    asyncio.run(main())
