"""Runs of blocks: consecutive (src, dst) block pairs merged into one contiguous copy on each side.

A pair list names which block goes where; a run is `count` blocks that advance by one on both
sides, hence one byte range in each block-major pool (`kv_cache`). Swap copies and KV transfers
(`pdserve/transfer/descriptors.py`) both move runs, never single blocks.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence


class BlockRun(NamedTuple):
    """`count` consecutive blocks: src_start.. in the sending pool, dst_start.. in the receiving one."""

    src_start: int
    dst_start: int
    count: int

    def src_blocks(self) -> range:
        return range(self.src_start, self.src_start + self.count)

    def dst_blocks(self) -> range:
        return range(self.dst_start, self.dst_start + self.count)


def extends(run: BlockRun, src: int, dst: int) -> bool:
    return src == run.src_start + run.count and dst == run.dst_start + run.count


def merge_runs(pairs: Sequence[tuple[int, int]]) -> tuple[BlockRun, ...]:
    """Merge pairs, in the given order, into maximal runs consecutive on both sides.

    Raises ValueError on a negative id or a destination block named twice (two writes into one
    block); a source block may appear twice (one block copied into two places).
    """
    _check_pairs(pairs)
    runs: list[BlockRun] = []
    for src, dst in pairs:
        if runs and extends(runs[-1], src, dst):
            runs[-1] = runs[-1]._replace(count=runs[-1].count + 1)
        else:
            runs.append(BlockRun(src, dst, 1))
    return tuple(runs)


def _check_pairs(pairs: Sequence[tuple[int, int]]) -> None:
    if any(src < 0 or dst < 0 for src, dst in pairs):
        raise ValueError("block ids must be non-negative")
    dsts = [dst for _, dst in pairs]
    if len(set(dsts)) != len(dsts):
        raise ValueError("a destination block appears twice in one transfer")
