"""Receiver bookkeeping shared by every transport: which pieces are live and which ids are retired.

A piece is admitted only when its dst blocks lie inside the pool and overlap no live piece, its
(transfer_id, seq) is not live and its transfer_id was not retired (withdrawn pieces may leave
messages behind that would match a reuse). Tags are the tag-matched transport's own business
(`wire.PieceKeys`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, Iterator, TypeVar

from pdserve.transfer.base import TransferRejected
from pdserve.transfer.descriptors import BlockRun, check_bounds, dst_block_ids

P = TypeVar("P")
PieceKey = tuple[str, int]


class Ledger(Generic[P]):
    def __init__(self, num_blocks: int, retired_capacity: int = 65536):
        self.num_blocks = num_blocks
        self._pieces: dict[PieceKey, P] = {}
        self._blocks: dict[PieceKey, tuple[int, ...]] = {}
        self._busy: set[int] = set()
        self._retired: OrderedDict[str, None] = OrderedDict()
        self._retired_capacity = retired_capacity

    def admit(self, transfer_id: str, seq: int, runs: tuple[BlockRun, ...], piece: P) -> None:
        """Record a live piece or raise TransferRejected (nothing recorded then)."""
        key = (transfer_id, seq)
        blocks = dst_block_ids(runs)
        self._check(key, runs, blocks)
        self._pieces[key] = piece
        self._blocks[key] = blocks
        self._busy.update(blocks)

    def _check(self, key: PieceKey, runs: tuple[BlockRun, ...], blocks: tuple[int, ...]) -> None:
        if key[0] in self._retired:
            raise TransferRejected(f"transfer {key[0]!r} was withdrawn; retry with a fresh id")
        if key in self._pieces:
            raise TransferRejected(f"piece {key} is already expected")
        try:
            check_bounds(runs, self.num_blocks, "dst")
        except ValueError as exc:
            raise TransferRejected(str(exc)) from exc
        if not self._busy.isdisjoint(blocks):
            raise TransferRejected(f"piece {key} overlaps blocks of a live piece")

    def remove(self, transfer_id: str, seq: int) -> None:
        key = (transfer_id, seq)
        if self._pieces.pop(key, None) is None:
            return
        self._busy.difference_update(self._blocks.pop(key))

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
