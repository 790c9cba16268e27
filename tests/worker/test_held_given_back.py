"""Prompts whose KV waits on a prefill worker for its reservation (target_follows) do not block a
queued request of a higher class: while it lacks the blocks they hold, lower-class ones give
theirs back (pdserve/scheduler/held.py chooses whom) and are computed again once their
reservation comes. Every prompt ends with the tokens it has when served alone, and both workers
end holding nothing."""

import asyncio

import pytest

from pdserve.requests import Priority
from pdserve.scheduler.held import Blocked, Held, KeepHeld, LowerClassLatest
from pdserve.worker.events import Chunk, FirstToken, Reserved
from pdserve.worker.leases import LeaseKind
from tests.worker.pair import BLOCK, GREEDY, decoded, make_pair, settle

pytestmark = pytest.mark.timeout(120)

HELD_PROMPTS = 5
HELD_LEN = 40  # tokens: 10 blocks each, all held
VIP_LEN = 64  # 16 blocks


def _prompt(i: int, length: int) -> tuple[int, ...]:
    """Distinct prompts: no block of one is in another's prefix."""
    return tuple(range(5 + 55 * i, 5 + 55 * i + length))  # (the tiny vocabulary: 384 ids)


async def _held(pair, rid: str, prompt: tuple[int, ...]):
    """A NORMAL prefill without its reservation, computed to its last chunk: all its KV held."""
    session = await pair.prefill.open(rid, prompt, GREEDY, Priority.NORMAL, None, 10.0)
    events = session.events()
    async for event in events:
        assert isinstance(event, Chunk), "no first token before the reservation"
        if event.start + event.num_tokens >= len(prompt):
            return session, events
    raise AssertionError("the prefill ended before its last chunk")


async def _finish(pair, rid: str, prompt: tuple[int, ...], p_session, p_events):
    """The router's part once the prefill started: the decode worker reserves, set_target, decode to the end."""
    d_session = await pair.decode.open(pair.job(rid, prompt))
    d_events = d_session.events()
    try:
        reserved = await anext(d_events)
        assert isinstance(reserved, Reserved)
        pair.prefill.set_target(rid, pair.target(reserved))
        first = [e async for e in p_events if isinstance(e, FirstToken)][0]
        got = await decoded(first.token_id, d_events)
        return got.first_token, got.tokens
    finally:
        pair.prefill.live.close(p_session)
        pair.decode.live.close(d_session)


def test_a_vip_prompt_starts_past_normal_prompts_holding_the_pool_and_they_complete_after(tiny_llama):
    async def main():
        pair = await make_pair(tiny_llama)
        kv = pair.prefill_engine.engine.scheduler.kv
        held_blocks, vip_blocks = -(-HELD_LEN // BLOCK), -(-VIP_LEN // BLOCK)
        # the held prompts fit beside the watermark; the VIP's whole prompt does not fit beside them,
        # and it does beside all but one of them: one given back is enough
        assert HELD_PROMPTS * held_blocks + kv.watermark_blocks <= kv.device.num_blocks
        assert HELD_PROMPTS * held_blocks + vip_blocks > kv.device.num_blocks
        assert (HELD_PROMPTS - 1) * held_blocks + vip_blocks + kv.watermark_blocks <= kv.device.num_blocks
        try:
            prompts = {f"n{i}": _prompt(i, HELD_LEN) for i in range(HELD_PROMPTS)}
            prompts["vip"] = _prompt(HELD_PROMPTS, VIP_LEN)
            expected = {}
            for rid, prompt in prompts.items():
                alone = await pair.serve(f"ref-{rid}", prompt)
                expected[rid] = (alone.first_token, alone.tokens)
            assert await settle(pair.prefill_engine) == 0

            held = {rid: await _held(pair, rid, prompts[rid]) for rid in prompts if rid != "vip"}
            assert pair.prefill.leases.live(LeaseKind.WAITING) == HELD_PROMPTS

            vip = await pair.prefill.open("vip", prompts["vip"], GREEDY, Priority.VIP, None, 10.0)
            vip_events = vip.events()
            async for chunk in vip_events:  # (no reservation of theirs comes before its last chunk)
                assert isinstance(chunk, Chunk)
                if chunk.start + chunk.num_tokens >= VIP_LEN:
                    break
            given_back = [rid for rid in held if pair.prefill.live[rid].given_back]
            assert len(given_back) == 1
            assert await _finish(pair, "vip", prompts["vip"], vip, vip_events) == expected["vip"]

            for rid, (session, events) in held.items():  # their reservations come: every one completes
                assert await _finish(pair, rid, prompts[rid], session, events) == expected[rid]
            assert await pair.holds_nothing()
        finally:
            await pair.stop()

    asyncio.run(main())


def test_a_given_back_prompt_whose_stream_ends_before_its_reservation_leaves_nothing(tiny_llama):
    async def main():
        pair = await make_pair(tiny_llama)
        try:
            session, _ = await _held(pair, "n", _prompt(0, HELD_LEN))
            pair.prefill.giving_back.give_back(pair.prefill.live["n"])
            assert pair.prefill.leases.live(LeaseKind.WAITING) == 0
            assert await settle(pair.prefill_engine) == 0  # its blocks back while its stream lives on
            pair.prefill.live.close(session)
            assert await settle(pair.prefill_engine) == 0
        finally:
            await pair.stop()

    asyncio.run(main())


def _h(rid: str, priority: Priority, blocks: int, at: float) -> Held:
    return Held(rid, priority, blocks, at)


def test_the_policy_gives_back_lower_classes_lowest_first_latest_first_and_only_enough():
    held = [_h("n-old", Priority.NORMAL, 4, 1.0), _h("n-new", Priority.NORMAL, 4, 2.0),
            _h("b", Priority.BATCH, 2, 0.5), _h("v", Priority.VIP, 20, 3.0)]
    policy = LowerClassLatest()
    assert policy.pick(held, Blocked(Priority.VIP, 1)) == ("b",)
    assert policy.pick(held, Blocked(Priority.VIP, 5)) == ("b", "n-new")
    assert policy.pick(held, Blocked(Priority.VIP, 10)) == ("b", "n-new", "n-old")
    assert policy.pick(held, Blocked(Priority.VIP, 11)) == ()  # all of them would not do: nobody
    assert policy.pick(held, Blocked(Priority.NORMAL, 2)) == ("b",)  # never its own class or a higher one
    assert policy.pick(held, Blocked(Priority.NORMAL, 3)) == ()
    assert policy.pick(held, Blocked(Priority.BATCH, 1)) == ()
    assert KeepHeld().pick(held, Blocked(Priority.VIP, 1)) == ()
