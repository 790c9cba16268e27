"""KV checksums between real workers (the tiny model, the in-process transport): the sender sums
each piece as it sends it, the decode worker sums what landed before the request may decode. With
a byte of a piece flipped in flight (the fault injection), no token is produced from it: the
decode stream fails DATA_LOSS-side (ChecksumMismatch), the sender's CorruptKV, and every block
comes back on both workers."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.errors import ChecksumMismatch, CorruptKV
from pdserve.requests import Priority
from pdserve.transfer.checksum import blocks_checksum
from pdserve.worker.events import FirstToken, Reserved, Tokens
from pdserve.worker.kv_sums import CorruptTrigger, KVSums
from tests.worker.pair import GREEDY, make_pair, settle

pytestmark = pytest.mark.timeout(120)
PROMPT = tuple(range(5, 45))  # 40 tokens: 5 chunks of 8, 5 pieces


def test_a_summed_transfer_decodes_as_an_unsummed_one(tiny_llama, tmp_path):
    async def main():
        pair = await make_pair(tiny_llama)
        try:
            plain = await pair.serve("plain", PROMPT)
            pair.prefill.sums = KVSums(pair.prefill_engine.engine.kv.data, CorruptTrigger(tmp_path / "never"))
            summed = await pair.serve("summed", PROMPT)
            return plain, summed, pair.decode.verifies, await settle(pair.decode_engine)
        finally:
            await pair.stop()

    plain, summed, verifies, left = asyncio.run(main())
    assert verifies and left == 0
    assert (summed.first_token, summed.tokens) == (plain.first_token, plain.tokens)


def test_a_byte_flipped_in_flight_yields_no_token_and_frees_every_block(tiny_llama, tmp_path):
    async def main():
        pair = await make_pair(tiny_llama)
        trigger = tmp_path / "corrupt"
        try:
            pair.prefill.sums = KVSums(pair.prefill_engine.engine.kv.data, CorruptTrigger(trigger))
            d_session = await pair.decode.open(pair.job("r", PROMPT))
            d_events = d_session.events()
            reserved = await anext(d_events)
            assert isinstance(reserved, Reserved)
            trigger.write_text("")  # the next piece sent is flipped, after it was summed
            p_session = await pair.prefill.open("r", PROMPT, GREEDY, Priority.NORMAL, pair.target(reserved), 10.0)
            p_events, d_seen = [], []
            with pytest.raises(CorruptKV):
                async for event in p_session.events():
                    p_events.append(event)
            pair.prefill.live.close(p_session)
            with pytest.raises(ChecksumMismatch):
                async for event in d_events:
                    d_seen.append(event)
            pair.decode.live.close(d_session)
            return (p_events, d_seen, trigger.exists(), await settle(pair.prefill_engine),
                    await settle(pair.decode_engine))
        finally:
            await pair.stop()

    p_events, d_seen, armed, prefill_left, decode_left = asyncio.run(main())
    assert not armed  # the corruption was claimed
    assert not [e for e in p_events if isinstance(e, FirstToken)] and not [e for e in d_seen if isinstance(e, Tokens)]
    assert (prefill_left, decode_left) == (0, 0)


def test_the_sum_covers_every_byte_of_every_block_in_order(tiny_llama):
    async def main():
        pair = await make_pair(tiny_llama)
        try:
            pool = pair.prefill_engine.engine.kv.data
            pool[3].normal_()
            pool[4].normal_()
            one = blocks_checksum(pool, (3, 4))
            swapped = blocks_checksum(pool, (4, 3))
            pool.view(pool.shape[0], -1)[4, -1] += 1.0  # the very last element of the second block
            return one, swapped, blocks_checksum(pool, (3, 4))
        finally:
            await pair.stop()

    one, swapped, changed = asyncio.run(main())
    assert len({one, swapped, changed}) == 3
