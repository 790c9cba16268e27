"""A follower's KV receives are held out of its pool until rank 0 says land: a transfer
withdrawn before that leaves no block unsafe, so its blocks are free at once."""

from __future__ import annotations

import asyncio

import pytest
import torch

from pdserve.parallel.kv_ops import Cancel, Expect, Land, PieceSpec
from pdserve.parallel.kv_ports import FollowerPort
from pdserve.transfer import TransferCancelled, TransferResult, make_transport
from tests.transfer.transfer_helpers import SECRET, make_pool, posted, run

pytestmark = pytest.mark.timeout(120)
PAIRS = [(3, 0), (4, 1), (9, 5)]


async def _held(receiver, sender, transfer_id: str) -> TransferResult:
    expect = asyncio.ensure_future(receiver.expect(transfer_id, 0, PAIRS, 10.0, secret=SECRET, hold=True))
    await posted(receiver, transfer_id, (0,), expect)
    await sender.send(receiver.address(), transfer_id, 0, PAIRS, 10.0, secret=SECRET)
    return await expect


def test_a_held_piece_reaches_the_pool_only_when_landed_and_a_withdrawn_one_never():
    async def main():
        transport = make_transport("ucx")
        src, dst = make_pool(fill=True), make_pool(fill=False)
        sender, receiver = transport.sender(src), transport.receiver(dst)
        try:
            result = await _held(receiver, sender, "a")
            assert result.nbytes == len(PAIRS) * src[0].numel() * 4
            assert dst.abs().sum() == 0
            receiver.land("a", 0)
            for s, d in PAIRS:
                assert torch.equal(dst[d], src[s])
            dst.zero_()
            await _held(receiver, sender, "b")
            cancelled = receiver.cancel("b")
            assert cancelled.pieces == 1 and cancelled.unsafe_blocks == ()
            with pytest.raises(TransferCancelled):
                receiver.land("b", 0)
            assert dst.abs().sum() == 0
        finally:
            await sender.close()
            await receiver.close()

    run(main())


class _Link:
    """A follower link whose answers the test gives: each call's op and future, in order."""

    def __init__(self):
        self.calls: list[tuple[object, asyncio.Future]] = []

    def call(self, op) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.calls.append((op, future))
        return future

    def answer(self, kind: type, value=None) -> None:
        future = next(f for op, f in self.calls if isinstance(op, kind) and not f.done())
        future.set_result(value)


PIECE = PieceSpec("t", 0, tuple(PAIRS), 10.0, SECRET, None)


def test_a_piece_withdrawn_before_it_lands_leaves_nothing_unsafe():
    async def main():
        link = _Link()
        port = FollowerPort(link)
        expect = asyncio.ensure_future(port.expect(PIECE))
        await asyncio.sleep(0)
        assert [type(op) for op, _ in link.calls] == [Expect]
        cancelled = port.cancel("t")
        expect.cancel()
        assert cancelled.unsafe_blocks == () and cancelled.settled is None
        assert isinstance(link.calls[-1][0], Cancel)
        await asyncio.gather(expect, return_exceptions=True)
        assert not any(isinstance(op, Land) for op, _ in link.calls)

    run(main())


def test_a_piece_landing_when_withdrawn_is_unsafe_until_its_land_is_answered():
    async def main():
        link = _Link()
        port = FollowerPort(link)
        expect = asyncio.ensure_future(port.expect(PIECE))
        await asyncio.sleep(0)
        link.answer(Expect, TransferResult("t", 0, 1, (), 0.0))
        while not any(isinstance(op, Land) for op, _ in link.calls):
            await asyncio.sleep(0)
        cancelled = port.cancel("t")
        expect.cancel()
        assert cancelled.unsafe_blocks == (0, 1, 5)
        await asyncio.sleep(0)
        assert not cancelled.settled.done()
        link.answer(Land)
        await asyncio.wait_for(cancelled.settled, 5)
        assert port.cancel("t").unsafe_blocks == ()

    run(main())
