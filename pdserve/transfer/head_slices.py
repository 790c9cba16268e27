"""KV head slices: which heads a sending and a receiving tensor-parallel rank share, where those
heads lie in each one's blocks, and how they are packed to travel.

Rank r of a worker at tensor parallel size n holds the contiguous KV heads [r*H/n, (r+1)*H/n)
(`rank_heads`), in a pool whose blocks are [layers, 2, block_size, local_heads, head_dim]. A
sender holding [g0, g1) and a receiver holding [h0, h1) share [o0, o1) = the intersection:

    global heads    0 ......... g0 ===== o0 ##### o1 ===== g1 ....... H      (# shared)
    sender block    local heads [o0 - g0, o1 - g0) of its g1 - g0
    receiver block  local heads [o0 - h0, o1 - h0) of its h1 - h0
    one block, one side: for each (layer, K/V, token) one run of (o1 - o0) * head_dim elements,
        at element ((layer * 2 + kv) * block_size + token) * local_heads * head_dim + slice.start * head_dim
    packed (what travels): [count, layers, 2, block_size, o1 - o0, head_dim], contiguous

A slice covering every local head is the whole block: one byte range, no packing (so equal
layouts move whole blocks, as at size 1). Pure functions of their arguments, except `pack` /
`unpack`, which copy.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from pdserve.kv.kv_shape import KVShape
from pdserve.transfer.descriptors import ByteRange


class HeadRange(NamedTuple):
    """KV heads [start, stop) of the whole model."""

    start: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.start

    def intersect(self, other: "HeadRange") -> "HeadRange | None":
        start, stop = max(self.start, other.start), min(self.stop, other.stop)
        return HeadRange(start, stop) if start < stop else None


class HeadSlice(NamedTuple):
    """Heads [start, stop) of one pool's own heads (local indices)."""

    start: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.start

    def is_whole(self, local_heads: int) -> bool:
        return self.start == 0 and self.stop == local_heads


class Share(NamedTuple):
    """The heads two ranks share, as each one's slice of its own pool."""

    heads: HeadRange
    sender: HeadSlice
    receiver: HeadSlice


def rank_heads(num_heads: int, size: int, rank: int) -> HeadRange:
    """The heads rank `rank` of `size` holds; ValueError unless `size` divides `num_heads`."""
    if size < 1 or num_heads % size or not 0 <= rank < size:
        raise ValueError(f"rank {rank} of {size}: the ranks must divide the {num_heads} KV heads")
    per = num_heads // size
    return HeadRange(rank * per, (rank + 1) * per)


def share(sender: HeadRange, receiver: HeadRange) -> Share | None:
    """What a sender holding `sender` moves to a receiver holding `receiver`; None when disjoint."""
    heads = sender.intersect(receiver)
    if heads is None:
        return None
    return Share(heads, _local(heads, sender), _local(heads, receiver))


def _local(heads: HeadRange, held: HeadRange) -> HeadSlice:
    return HeadSlice(heads.start - held.start, heads.stop - held.start)


def pool_shape(pool: torch.Tensor) -> KVShape:
    """The block layout of a pool [num_blocks, layers, 2, block_size, kv_heads, head_dim]."""
    _, layers, _, block_size, heads, head_dim = pool.shape
    return KVShape(layers, heads, head_dim, block_size)


def checked_slice(pool: torch.Tensor, heads: "HeadSlice | None") -> HeadSlice:
    """`heads` (None: every head of the pool); ValueError when it is empty or outside the pool's heads."""
    local = pool.shape[4]
    heads = HeadSlice(0, local) if heads is None else heads
    if not 0 <= heads.start < heads.stop <= local:
        raise ValueError(f"heads {tuple(heads)} outside the pool's {local} KV heads")
    return heads


def slice_nbytes(shape: KVShape, heads: HeadSlice, element_size: int) -> int:
    """Bytes of one block's slice (the packed block size)."""
    return shape.num_layers * 2 * shape.block_size * heads.count * shape.head_dim * element_size


def block_runs(shape: KVShape, heads: HeadSlice, element_size: int) -> tuple[ByteRange, ...]:
    """The byte ranges of `heads` inside one block (offsets from the block's start); one range
    for the whole block."""
    row = shape.head_dim * element_size
    if heads.is_whole(shape.num_kv_heads):
        return (ByteRange(0, shape.num_kv_heads * row * 2 * shape.num_layers * shape.block_size),)
    stride = shape.num_kv_heads * row
    rows = shape.num_layers * 2 * shape.block_size
    return tuple(ByteRange(i * stride + heads.start * row, heads.count * row) for i in range(rows))


def block_view(pool: torch.Tensor, start: int, count: int, heads: HeadSlice) -> torch.Tensor:
    """[count, layers, 2, block_size, heads.count, head_dim], a strided view of blocks
    start..start+count of `pool` ([num_blocks, layers, 2, block_size, kv_heads, head_dim])."""
    return pool[start : start + count, :, :, :, heads.start : heads.stop]


def pack(pool: torch.Tensor, start: int, count: int, heads: HeadSlice) -> torch.Tensor:
    """The slice of blocks start.., contiguous: [count, layers, 2, block_size, heads.count, head_dim]."""
    return block_view(pool, start, count, heads).contiguous()


def unpack(pool: torch.Tensor, start: int, heads: HeadSlice, packed: torch.Tensor) -> None:
    """Write a packed slice into blocks start.. of `pool`: `packed` holds `pack`'s values, as
    that tensor or as its contiguous bytes, [count, ...] either way."""
    view = block_view(pool, start, packed.shape[0], heads)
    view.copy_(packed.reshape(-1).view(pool.dtype).view(view.shape))
