"""Head slices between tensor-parallel layouts: the shared heads and their byte runs, packing, and
both transports moving every (p, d) split of a pool so that the receivers reassemble it exactly."""

import asyncio
import itertools

import pytest
import torch

from pdserve.kv.kv_cache import KVCache
from pdserve.kv.kv_shape import KVShape
from pdserve.transfer import InProcessFabric, TransferError, TransferRejected, make_transport
from pdserve.transfer.descriptors import merge_runs
from pdserve.transfer.head_slices import (
    HeadRange,
    HeadSlice,
    block_runs,
    pack,
    rank_heads,
    share,
    slice_nbytes,
    unpack,
)
from pdserve.transfer.ledger import Ledger
from pdserve.transfer.ucx import UcxConfig
from tests.transfer.transfer_helpers import SECRET, posted, run

pytestmark = pytest.mark.timeout(120)

HEADS = 6  # every size in {1, 2, 3} divides it
SHAPE = KVShape(num_layers=2, num_kv_heads=HEADS, head_dim=8, block_size=4)
NUM_BLOCKS = 12
PAIRS = [(0, 5), (1, 6), (2, 7), (7, 0), (3, 11), (4, 2)]
UCX = UcxConfig(max_message_bytes=2 * slice_nbytes(SHAPE, HeadSlice(0, 1), 4))  # runs cut into messages


def source_pool() -> torch.Tensor:
    """[blocks, layers, 2, block_size, HEADS, head_dim], every element distinct."""
    return torch.arange(NUM_BLOCKS * SHAPE.block_numel(), dtype=torch.float32).view(
        NUM_BLOCKS, SHAPE.num_layers, 2, SHAPE.block_size, HEADS, SHAPE.head_dim)


def rank_pool(size: int) -> torch.Tensor:
    shape = KVShape(SHAPE.num_layers, HEADS // size, SHAPE.head_dim, SHAPE.block_size)
    return KVCache(shape, NUM_BLOCKS, torch.float32, "cpu").data


def test_rank_heads_split_evenly_and_refuse_what_does_not_divide():
    assert [rank_heads(6, 3, r) for r in range(3)] == [(0, 2), (2, 4), (4, 6)]
    assert rank_heads(6, 1, 0) == (0, 6)
    with pytest.raises(ValueError, match="divide"):
        rank_heads(6, 4, 0)


def test_share_is_the_intersection_as_each_side_s_local_slice():
    assert share(HeadRange(0, 3), HeadRange(2, 4)) == ((2, 3), (2, 3), (0, 1))
    assert share(HeadRange(0, 6), HeadRange(3, 6)) == ((3, 6), (3, 6), (0, 3))
    assert share(HeadRange(0, 2), HeadRange(2, 4)) is None


def test_block_runs_name_exactly_the_bytes_of_the_slice():
    pool = source_pool()
    block = pool[3].reshape(-1).view(torch.uint8)
    for heads in (HeadSlice(0, HEADS), HeadSlice(1, 3), HeadSlice(5, 6)):
        runs = block_runs(SHAPE, heads, 4)
        got = torch.cat([block[r.offset : r.offset + r.nbytes] for r in runs])
        assert torch.equal(got, pack(pool, 3, 1, heads).reshape(-1).view(torch.uint8))
        assert sum(r.nbytes for r in runs) == slice_nbytes(SHAPE, heads, 4)
    assert len(block_runs(SHAPE, HeadSlice(0, HEADS), 4)) == 1
    assert len(block_runs(SHAPE, HeadSlice(1, 3), 4)) == SHAPE.num_layers * 2 * SHAPE.block_size


def test_unpack_takes_packed_values_or_their_bytes():
    pool, dst = source_pool(), torch.zeros(NUM_BLOCKS, SHAPE.num_layers, 2, SHAPE.block_size, 2, SHAPE.head_dim)
    packed = pack(pool, 2, 3, HeadSlice(2, 4))
    unpack(dst, 5, HeadSlice(0, 2), packed.view(3, -1).view(torch.uint8))
    assert torch.equal(dst[5:8], pool[2:5, :, :, :, 2:4])
    assert dst[:5].abs().sum() == 0 and dst[8:].abs().sum() == 0


def test_ledger_lets_disjoint_slices_share_a_block_and_refuses_overlapping_ones():
    ledger: Ledger[str] = Ledger(8)
    runs = merge_runs([(0, 3), (1, 4)])
    ledger.admit("t/0", 0, runs, "a", HeadSlice(0, 2))
    ledger.admit("t/1", 0, runs, "b", HeadSlice(2, 4))
    with pytest.raises(TransferRejected, match="overlaps"):
        ledger.admit("t/2", 0, merge_runs([(5, 4)]), "c", HeadSlice(1, 3))
    with pytest.raises(TransferRejected, match="overlaps"):
        ledger.admit("t/3", 0, merge_runs([(5, 3)]), "d")
    ledger.remove("t/0", 0)
    ledger.admit("t/2", 0, merge_runs([(5, 4)]), "c", HeadSlice(1, 2))


async def move(transport_name: str, p: int, d: int) -> tuple[list[torch.Tensor], list]:
    """Split the source pool over p sender ranks, move every shared slice of PAIRS to d receiver
    ranks, as a tensor-parallel prefill worker does for one piece; the receivers' pools and the
    senders' results."""
    transport = make_transport(transport_name, fabric=InProcessFabric(), ucx=UCX)
    src = source_pool()
    send_pools = [src[:, :, :, :, h.start : h.stop].contiguous() for h in (rank_heads(HEADS, p, k) for k in range(p))]
    recv_pools = [rank_pool(d) for _ in range(d)]
    senders = [transport.sender(pool) for pool in send_pools]
    receivers = [transport.receiver(pool) for pool in recv_pools]
    moves = [(k, j, s) for k, j in itertools.product(range(p), range(d))
             if (s := share(rank_heads(HEADS, p, k), rank_heads(HEADS, d, j))) is not None]
    expects = [asyncio.ensure_future(receivers[j].expect(f"t/{k}", 0, PAIRS, 10.0, secret=SECRET, heads=s.receiver))
               for k, j, s in moves]
    for (k, j, _), expect in zip(moves, expects):
        await posted(receivers[j], f"t/{k}", (0,), expect)
    sent = await asyncio.gather(*(senders[k].send(receivers[j].address(), f"t/{k}", 0, PAIRS, 10.0, secret=SECRET,
                                                  heads=s.sender) for k, j, s in moves))
    got = await asyncio.gather(*expects)
    assert [r.nbytes for r in sent] == [r.nbytes for r in got]
    for end in [*senders, *receivers]:
        await end.close()
    return recv_pools, list(zip(moves, sent))


@pytest.mark.parametrize("p,d", list(itertools.product((1, 2, 3), repeat=2)))
def test_every_split_reassembles_the_source_exactly(transport_name, p, d):
    recv_pools, sent = run(move(transport_name, p, d))
    src, whole = source_pool(), torch.cat(recv_pools, dim=4)
    for s, t in PAIRS:
        assert torch.equal(whole[t], src[s]), f"block {s} -> {t}"
    untouched = sorted(set(range(NUM_BLOCKS)) - {t for _, t in PAIRS})
    assert whole[untouched].abs().sum() == 0
    per_rank = [sum(r.nbytes for (k, _, _), r in sent if k == rank) for rank in range(p)]
    assert per_rank == [len(PAIRS) * slice_nbytes(SHAPE, HeadSlice(0, HEADS // p), 4)] * p  # each its own share


@pytest.mark.parametrize("p", [1, 2, 3])
def test_equal_layouts_move_whole_blocks_between_rank_pairs(transport_name, p):
    _, sent = run(move(transport_name, p, p))
    assert [(k, j) for (k, j, _), _ in sent] == [(k, k) for k in range(p)]
    assert all(r.runs == merge_runs(PAIRS) for _, r in sent)


def test_a_slice_of_another_width_fails_the_piece_and_lands_nothing(transport_name):
    async def main():
        transport = make_transport(transport_name, fabric=InProcessFabric(), ucx=UCX)
        sender, dst = transport.sender(source_pool()), rank_pool(2)
        receiver = transport.receiver(dst)
        expect = asyncio.ensure_future(receiver.expect("w", 0, PAIRS, 5.0, secret=SECRET, heads=HeadSlice(0, 2)))
        await posted(receiver, "w", (0,), expect)
        send = asyncio.ensure_future(receiver_send(sender, receiver, HeadSlice(0, 1)))
        with pytest.raises(TransferError):
            await expect
        await asyncio.gather(send, return_exceptions=True)
        assert dst.abs().sum() == 0
        await sender.close()
        await receiver.close()

    run(main())


async def receiver_send(sender, receiver, heads):
    return await sender.send(receiver.address(), "w", 0, PAIRS, 2.0, secret=SECRET, heads=heads)
