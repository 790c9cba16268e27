"""Receiver bookkeeping shared by every transport: which pieces are live and which ids are retired.

A piece is admitted only when its dst blocks lie inside the pool and overlap no live piece (two
pieces may share a block when they carry disjoint head slices of it), its
(transfer_id, seq) is not live and its transfer_id was not retired (withdrawn pieces may leave
messages behind that would match a reuse). Tags are the tag-matched transport's own business
(`wire.PieceKeys`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, Iterator, TypeVar

from pdserve.transfer.base import TransferRejected
from pdserve.transfer.descriptors import BlockRun, check_bounds, dst_block_ids
from pdserve.transfer.head_slices import HeadSlice

P = TypeVar("P")
PieceKey = tuple[str, int]
EVERY_HEAD = HeadSlice(0, 1 << 31)


class Ledger(Generic[P]):
    def __init__(self, num_blocks: int, retired_capacity: int = 65536):
        self.num_blocks = num_blocks
        self._pieces: dict[PieceKey, P] = {}
        self._blocks: dict[PieceKey, tuple[tuple[int, ...], HeadSlice]] = {}
        self._busy: dict[int, list[HeadSlice]] = {}
        self._retired: OrderedDict[str, None] = OrderedDict()
        self._retired_capacity = retired_capacity

    def admit(self, transfer_id: str, seq: int, runs: tuple[BlockRun, ...], piece: P,
              heads: HeadSlice | None = None) -> None:
        """Record a live piece writing `heads` of its dst blocks (None: all of them), or raise
        TransferRejected (nothing recorded then)."""
        key, heads = (transfer_id, seq), heads or EVERY_HEAD
        blocks = dst_block_ids(runs)
        self._check(key, runs, blocks, heads)
        self._pieces[key] = piece
        self._blocks[key] = (blocks, heads)
        for block in blocks:
            self._busy.setdefault(block, []).append(heads)

    def _check(self, key: PieceKey, runs: tuple[BlockRun, ...], blocks: tuple[int, ...], heads: HeadSlice) -> None:
        if key[0] in self._retired:
            raise TransferRejected(f"transfer {key[0]!r} was withdrawn; retry with a fresh id")
        if key in self._pieces:
            raise TransferRejected(f"piece {key} is already expected")
        try:
            check_bounds(runs, self.num_blocks, "dst")
        except ValueError as exc:
            raise TransferRejected(str(exc)) from exc
        if any(_overlap(held, heads) for block in blocks for held in self._busy.get(block, ())):
            raise TransferRejected(f"piece {key} overlaps blocks of a live piece")

    def remove(self, transfer_id: str, seq: int) -> None:
        key = (transfer_id, seq)
        if self._pieces.pop(key, None) is None:
            return
        blocks, heads = self._blocks.pop(key)
        for block in blocks:
            held = self._busy[block]
            held.remove(heads)
            if not held:
                del self._busy[block]

    def retire(self, transfer_id: str) -> None:
        self._retired[transfer_id] = None
        self._retired.move_to_end(transfer_id)
        while len(self._retired) > self._retired_capacity:
            self._retired.popitem(last=False)

    def pieces_of(self, transfer_id: str) -> list[P]:
        return [piece for (tid, _), piece in self._pieces.items() if tid == transfer_id]

    def lookup(self, transfer_id: str, seq: int) -> P | None:
        return self._pieces.get((transfer_id, seq))

    def __iter__(self) -> Iterator[P]:
        return iter(list(self._pieces.values()))

    def __len__(self) -> int:
        return len(self._pieces)


def _overlap(a: HeadSlice, b: HeadSlice) -> bool:
    return a.start < b.stop and b.start < a.stop
