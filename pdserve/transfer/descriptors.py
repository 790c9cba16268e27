"""Block pairs -> runs -> byte ranges: the one description both sides derive from a pair list.

A transfer piece is a list of (src_block, dst_block) pairs, in the order the control plane sent
them. Consecutive pairs that advance by one on both sides merge into one run; a run is one
contiguous byte range in each block-major pool, so it travels as one message:

    pairs  (4,10) (5,11) (6,12) (9,13) (10,14)
    runs   BlockRun(src_start=4, dst_start=10, count=3)  BlockRun(9, 13, 2)
    bytes  src [4*B, 7*B) -> dst [10*B, 13*B);  src [9*B, 11*B) -> dst [13*B, 15*B)   (B = block_nbytes)

Every function here is a pure function of its arguments, so the sender and the receiver get the
identical runs, messages and digest from the identical pair list.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Iterable, NamedTuple, Sequence

from pdserve.kv.block_runs import BlockRun, extends, merge_runs


class ByteRange(NamedTuple):
    offset: int
    nbytes: int


def split_runs(runs: Iterable[BlockRun], max_blocks: int) -> tuple[BlockRun, ...]:
    """Cut runs longer than max_blocks into pieces of at most max_blocks (bounds one message)."""
    if max_blocks < 1:
        raise ValueError("max_blocks must be >= 1")
    pieces: list[BlockRun] = []
    for run in runs:
        for first in range(0, run.count, max_blocks):
            count = min(max_blocks, run.count - first)
            pieces.append(BlockRun(run.src_start + first, run.dst_start + first, count))
    return tuple(pieces)


def join_runs(runs: Iterable[BlockRun]) -> tuple[BlockRun, ...]:
    """Undo split_runs: join runs that continue each other on both sides."""
    joined: list[BlockRun] = []
    for run in runs:
        if joined and extends(joined[-1], run.src_start, run.dst_start):
            joined[-1] = joined[-1]._replace(count=joined[-1].count + run.count)
        else:
            joined.append(run)
    return tuple(joined)


def plan_messages(
    pairs: Sequence[tuple[int, int]], block_nbytes: int, max_message_bytes: int
) -> tuple[BlockRun, ...]:
    """Runs of `pairs`, each cut to at most max_message_bytes (never below one block)."""
    return split_runs(merge_runs(pairs), max(1, max_message_bytes // block_nbytes))


def src_range(run: BlockRun, block_nbytes: int) -> ByteRange:
    return ByteRange(run.src_start * block_nbytes, run.count * block_nbytes)


def dst_range(run: BlockRun, block_nbytes: int) -> ByteRange:
    return ByteRange(run.dst_start * block_nbytes, run.count * block_nbytes)


def total_blocks(runs: Iterable[BlockRun]) -> int:
    return sum(run.count for run in runs)


def dst_block_ids(runs: Iterable[BlockRun]) -> tuple[int, ...]:
    return tuple(block for run in runs for block in run.dst_blocks())


def check_bounds(runs: Iterable[BlockRun], num_blocks: int, side: str) -> None:
    """Raise ValueError when a run reaches past a pool of num_blocks on `side` ("src" or "dst")."""
    for run in runs:
        start = run.src_start if side == "src" else run.dst_start
        if start + run.count > num_blocks:
            raise ValueError(f"{side} blocks {start}..{start + run.count - 1} outside a pool of {num_blocks}")


def runs_digest(runs: Iterable[BlockRun], block_nbytes: int) -> bytes:
    """16 bytes naming the exact layout (runs and block size); equal on both sides or mismatched."""
    h = hashlib.blake2b(digest_size=16)
    h.update(struct.pack("<Q", block_nbytes))
    for run in runs:
        h.update(struct.pack("<QQQ", *run))
    return h.digest()
