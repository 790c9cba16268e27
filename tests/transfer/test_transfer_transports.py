"""Both transports against one contract; UCX runs both ends as two workers in this process."""

import asyncio
import time

import pytest
import torch
from tests.transfer.transfer_helpers import NUM_BLOCKS, SECRET, make_pool, posted, run

from pdserve.transfer import (
    InProcessFabric,
    TransferCancelled,
    TransferError,
    TransferRejected,
    TransferResult,
    TransferTimeout,
    make_transport,
)
from pdserve.transfer.ucx import UcxConfig
from tests.helpers.waiting import async_wait_until

pytestmark = pytest.mark.timeout(60)

# 2 blocks per message: multi-block runs are cut into several UCX messages.
UCX = UcxConfig(max_message_bytes=2 * 65536)


def ends(name):
    transport = make_transport(name, fabric=InProcessFabric(), ucx=UCX)
    src, dst = make_pool(fill=True), make_pool(fill=False)
    return transport.sender(src), transport.receiver(dst), src, dst


def assert_landed(src, dst, pairs, before):
    written = {d for _, d in pairs}
    for s, d in pairs:
        assert torch.equal(dst[d], src[s]), f"block {s} -> {d}"
    untouched = [b for b in range(dst.shape[0]) if b not in written]
    assert torch.equal(dst[untouched], before[untouched])


async def both(sender, receiver, tid, seq, pairs, timeout=10.0):
    expect = asyncio.create_task(receiver.expect(tid, seq, pairs, timeout, secret=SECRET))
    await posted(receiver, tid, (seq,), expect)
    sent = await sender.send(receiver.address(), tid, seq, pairs, timeout, secret=SECRET)
    return sent, await expect


async def close(sender, receiver):
    await sender.close()
    await receiver.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_multi_run_piece_lands_in_exactly_its_blocks(transport_name, loop):
    async def main():
        sender, receiver, src, dst = ends(transport_name)
        before = dst.clone()
        pairs = [(3, 20), (4, 21), (5, 22), (6, 23), (7, 24), (0, 2), (9, 9), (10, 10), (30, 0)]
        sent, got = await both(sender, receiver, "req-1", 0, pairs)
        assert_landed(src, dst, pairs, before)
        assert sent.nbytes == got.nbytes == len(pairs) * 65536
        assert [tuple(r) for r in got.runs] == [(3, 20, 5), (0, 2, 1), (9, 9, 2), (30, 0, 1)]
        assert got.runs == sent.runs and got.seconds > 0
        await close(sender, receiver)

    run(main(), loop)


def test_pieces_of_one_transfer_and_several_transfers_in_flight(transport_name):
    async def main():
        sender, receiver, src, dst = ends(transport_name)
        before = dst.clone()
        plan = {("a", 0): [(0, 0), (1, 1)], ("a", 1): [(2, 2), (3, 3)], ("b", 0): [(4, 10), (5, 11), (6, 12)],
                ("c", 0): [(7, 20)], ("c", 5): [(8, 25), (9, 26)]}
        expects = [receiver.expect(t, s, p, 10.0, secret=SECRET) for (t, s), p in plan.items()]
        sends = [sender.send(receiver.address(), t, s, p, 10.0, secret=SECRET)
                 for (t, s), p in reversed(plan.items())]
        results = await asyncio.gather(*expects, *sends)
        assert [(r.transfer_id, r.seq) for r in results[: len(plan)]] == list(plan)
        assert_landed(src, dst, [p for pairs in plan.values() for p in pairs], before)
        await close(sender, receiver)

    run(main())


def test_timeout_when_nothing_is_sent_and_a_late_send_never_lands(transport_name):
    async def main():
        sender, receiver, src, dst = ends(transport_name)
        before = dst.clone()
        started = time.monotonic()
        with pytest.raises(TransferTimeout) as raised:
            await receiver.expect("late", 0, [(1, 5), (2, 6)], 0.3, secret=SECRET)
        assert time.monotonic() - started >= 0.3  # never before its timeout...
        assert "timed out after 0.3 s" in str(raised.value)  # ...and ended by that one, not by a later wait
        assert raised.value.unsafe_blocks == ()
        with pytest.raises(TransferTimeout):
            await sender.send(receiver.address(), "late", 0, [(1, 5), (2, 6)], 0.3, secret=SECRET)
        await both(sender, receiver, "after", 0, [(3, 30)])  # a later piece on the same path landed
        assert_landed(src, dst, [(3, 30)], before)  # and the late one did not
        with pytest.raises(TransferRejected):
            await receiver.expect("late", 0, [(1, 5), (2, 6)], 0.3, secret=SECRET)
        await close(sender, receiver)

    run(main())


def test_cancel_withdraws_the_transfer_and_frees_its_blocks(transport_name):
    async def main():
        sender, receiver, src, dst = ends(transport_name)
        before = dst.clone()
        pieces = [asyncio.create_task(receiver.expect("gone", s, [(s, 10 + s)], 10.0, secret=SECRET))
                  for s in range(3)]
        await posted(receiver, "gone", range(3))
        result = receiver.cancel("gone")
        assert (result.pieces, result.unsafe_blocks) == (3, ())
        for piece in pieces:
            with pytest.raises(TransferCancelled):
                await piece
        with pytest.raises(TransferTimeout):
            await sender.send(receiver.address(), "gone", 0, [(0, 10)], 0.3, secret=SECRET)
        assert torch.equal(dst, before)
        sent, _ = await both(sender, receiver, "next", 0, [(5, 10), (6, 11)])
        assert_landed(src, dst, [(5, 10), (6, 11)], before)
        await close(sender, receiver)

    run(main())


def test_unexpected_transfer_is_never_written(transport_name):
    async def main():
        sender, receiver, src, dst = ends(transport_name)
        before = dst.clone()
        with pytest.raises(TransferTimeout):
            await sender.send(receiver.address(), "stranger", 0, [(0, 0), (1, 1)], 0.3, secret=SECRET)
        assert torch.equal(dst, before)
        await both(sender, receiver, "known", 0, [(2, 0), (3, 1)])
        assert_landed(src, dst, [(2, 0), (3, 1)], before)
        await close(sender, receiver)

    run(main())


def test_a_piece_sent_under_another_secret_never_lands(transport_name):
    """The receiver posted the piece; a sender knowing its id, seq and blocks but not its
    secret is never matched: its send times out, nothing is written, and the holder of the
    secret then fills the piece as if nothing had happened."""
    async def main():
        sender, receiver, src, dst = ends(transport_name)
        before = dst.clone()
        pairs = [(0, 4), (1, 5), (2, 6)]
        expect = asyncio.create_task(receiver.expect("r", 0, pairs, 5.0, secret=SECRET))
        await posted(receiver, "r", (0,), expect)
        with pytest.raises(TransferTimeout):  # its whole timeout to land, posted receives waiting
            await sender.send(receiver.address(), "r", 0, pairs, 0.5, secret=b"wrong secret 16b")
        assert torch.equal(dst, before) and not expect.done()
        sent = await sender.send(receiver.address(), "r", 0, pairs, 5.0, secret=SECRET)
        assert (await expect).nbytes == sent.nbytes
        assert_landed(src, dst, pairs, before)
        await close(sender, receiver)

    run(main())


@pytest.mark.parametrize("secret", [b"", b"too short"])
def test_a_malformed_secret_is_refused_on_both_ends(transport_name, secret):
    async def main():
        sender, receiver, src, dst = ends(transport_name)
        with pytest.raises(TransferRejected):
            await receiver.expect("s", 0, [(0, 0)], 1.0, secret=secret)
        with pytest.raises(ValueError):
            await sender.send(receiver.address(), "s", 0, [(0, 0)], 1.0, secret=secret)
        await both(sender, receiver, "s", 0, [(0, 0)])
        await close(sender, receiver)

    run(main())


def test_send_to_a_closed_receiver_fails_within_its_timeout(transport_name):
    async def main():
        sender, receiver, src, dst = ends(transport_name)
        await both(sender, receiver, "warm", 0, [(0, 0)])
        address = receiver.address()
        await receiver.close()
        with pytest.raises(TransferError) as raised:
            await sender.send(address, "after", 0, [(1, 1)], 0.5, secret=SECRET)
        # refused at once, or given up at the send's own deadline: never a wait beyond it
        assert any(why in str(raised.value) for why in ("no receiver at", "cannot reach peer",
                                                        "not delivered by the deadline")), raised.value
        await sender.close()

    run(main())


def test_layout_mismatch_fails_the_piece(transport_name):
    async def main():
        sender, receiver, src, dst = ends(transport_name)
        expect = asyncio.create_task(receiver.expect("m", 0, [(0, 4), (1, 5)], 0.5, secret=SECRET))
        await posted(receiver, "m", (0,), expect)
        send = asyncio.create_task(sender.send(receiver.address(), "m", 0, [(0, 4), (2, 5)], 0.5, secret=SECRET))
        with pytest.raises(TransferError):
            await expect
        with pytest.raises(TransferError):
            await send
        await close(sender, receiver)

    run(main())


def test_block_size_mismatch_fails_the_piece(transport_name):
    async def main():
        transport = make_transport(transport_name, fabric=InProcessFabric(), ucx=UCX)
        receiver = transport.receiver(make_pool(fill=False))
        sender = transport.sender(make_pool(fill=True)[:, :2].contiguous())
        expect = asyncio.create_task(receiver.expect("m", 0, [(0, 4), (1, 5)], 1.0, secret=SECRET))
        await posted(receiver, "m", (0,), expect)
        send = asyncio.create_task(sender.send(receiver.address(), "m", 0, [(0, 4), (1, 5)], 1.0, secret=SECRET))
        with pytest.raises(TransferError) as raised:
            await expect
        assert not isinstance(raised.value, (TransferCancelled, TransferTimeout))
        sent = await asyncio.gather(send, return_exceptions=True)
        assert isinstance(sent[0], (TransferError, TransferResult))  # UCX: delivered, then refused
        with pytest.raises(TransferRejected):
            await receiver.expect("m", 1, [(0, 4)], 1.0, secret=SECRET)
        await close(sender, receiver)

    run(main())


def test_overlapping_and_out_of_pool_pieces_are_rejected(transport_name):
    async def main():
        sender, receiver, src, dst = ends(transport_name)
        live = asyncio.create_task(receiver.expect("a", 0, [(0, 3), (1, 4)], 5.0, secret=SECRET))
        await posted(receiver, "a", (0,), live)
        with pytest.raises(TransferRejected):
            await receiver.expect("b", 0, [(0, 4)], 1.0, secret=SECRET)
        with pytest.raises(TransferRejected):
            await receiver.expect("b", 0, [(0, NUM_BLOCKS)], 1.0, secret=SECRET)
        live.cancel()
        with pytest.raises(asyncio.CancelledError):
            await live
        await both(sender, receiver, "b", 0, [(0, 4)])
        await close(sender, receiver)

    run(main())


def test_send_before_expect_completes_once_expected(transport_name):
    async def main():
        sender, receiver, src, dst = ends(transport_name)
        before = dst.clone()
        pairs = [(0, 7), (1, 8), (2, 9)]
        send = asyncio.create_task(sender.send(receiver.address(), "early", 0, pairs, 5.0, secret=SECRET))
        done, _ = await asyncio.wait({send}, timeout=0.2)  # NOTE: an absence is only watched for a while
        assert not done and torch.equal(dst, before)
        got = await receiver.expect("early", 0, pairs, 5.0, secret=SECRET)
        assert (await send).nbytes == got.nbytes
        assert_landed(src, dst, pairs, before)
        await close(sender, receiver)

    run(main())


def test_closed_receiver_refuses_new_pieces(transport_name):
    async def main():
        sender, receiver, src, dst = ends(transport_name)
        live = asyncio.create_task(receiver.expect("a", 0, [(0, 0)], 5.0, secret=SECRET))
        await posted(receiver, "a", (0,), live)
        await receiver.close()
        with pytest.raises(TransferCancelled):
            await live
        with pytest.raises(TransferRejected):
            await receiver.expect("b", 0, [(0, 1)], 1.0, secret=SECRET)
        await sender.close()

    run(main())


def test_inprocess_cancel_mid_copy_stops_before_the_next_block():
    from pdserve.transfer.inprocess import InProcessReceiver, InProcessSender

    async def main():
        fabric = InProcessFabric()
        src, dst = make_pool(fill=True), make_pool(fill=False)
        receiver, sender = InProcessReceiver(fabric, dst), InProcessSender(fabric, src, max_copy_bytes=1)
        pairs = [(i, i) for i in range(8)]
        expect = asyncio.create_task(receiver.expect("t", 0, pairs, 5.0, secret=SECRET))
        send = asyncio.create_task(sender.send(receiver.address(), "t", 0, pairs, 5.0, secret=SECRET))
        await async_wait_until(lambda: dst[0].any(), 10, "the first block copied", interval_s=0)
        receiver.cancel("t")
        snapshot = dst.clone()
        with pytest.raises(TransferError):
            await send
        with pytest.raises(TransferCancelled):
            await expect
        assert torch.equal(dst, snapshot) and not dst[7].any()

    run(main())
