"""KV arriving for one reserved request on a decode worker, and what a withdrawal leaves unsafe."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from pdserve.errors import ChecksumMismatch, InvalidRequestError
from pdserve.kv.page_groups import NULL_PAGE
from pdserve.transfer import CancelResult, TransferError, settled_all
from pdserve.transfer.checksum import NONE
from pdserve.worker.leases import Lease


@dataclass(frozen=True)
class Unsafe:
    """Blocks a withdrawn receive may still write; `settled` resolves once nothing can (None:
    the transport cannot tell, so only the quarantine's time limit frees them)."""

    blocks: tuple[int, ...] = ()
    settled: asyncio.Future | None = None

    @staticmethod
    def of(parts: list[CancelResult | TransferError]) -> "Unsafe":
        unsafe = [p for p in parts if p.unsafe_blocks]
        blocks = tuple(sorted({b for p in unsafe for b in p.unsafe_blocks}))
        return Unsafe(blocks, settled_all([p.settled for p in unsafe]))


@dataclass(eq=False)
class Intake:
    """KV arriving for one reserved request. Its reservation lease is owned by the router's
    Decode stream; its limit is the KV deadline between pieces (armed by the first piece).
    `secret` is drawn here for this reservation alone: only its holder may announce pieces,
    complete the transfer, or have its data land (it keys the transport's tags).

    The first `cached_blocks` are this worker's own prefix-cache hits, shared: no piece may write
    them.

    NOTE: announced pieces never overlap, and the transfer completes only once they cover every
    reserved block past the cached ones: no request decodes from a block nobody wrote."""

    transfer_id: str
    request_id: str
    block_ids: tuple[int, ...]
    kv_timeout_s: float
    lease: Lease
    secret: bytes = field(repr=False)
    pieces: dict[int, asyncio.Task] = field(default_factory=dict)
    announced: set[int] = field(default_factory=set)  # indexes into block_ids of announced pieces
    cached_blocks: int = 0  # leading entries of block_ids (G a block, pdserve/kv/page_groups.py) held already
    landed: dict[int, tuple[int, ...]] = field(default_factory=dict)  # seq -> the blocks its data goes to
    sums: dict[int, asyncio.Future] = field(default_factory=dict)  # seq -> the sum of its blocks as landed

    def announce(self, seq: int, block_index: int, count: int) -> tuple[int, ...]:
        """The reserved blocks of a new piece [block_index, block_index + count), recorded as
        announced; InvalidRequestError (nothing recorded) for an empty, repeated, out-of-range
        or overlapping piece."""
        end = block_index + count
        where = f"piece {seq} of {self.transfer_id}: blocks [{block_index}, {end})"
        if count < 1 or end > len(self.block_ids) or block_index < self.cached_blocks:
            raise InvalidRequestError(f"{where} empty or outside blocks [{self.cached_blocks}, "
                                      f"{len(self.block_ids)}) of the reservation (the first {self.cached_blocks} "
                                      "are cached here)")
        if seq in self.pieces or seq >= len(self.block_ids):
            raise InvalidRequestError(f"{where}: seq repeated or beyond one piece per block")
        span = range(block_index, end)
        if not self.announced.isdisjoint(span):
            raise InvalidRequestError(f"{where} overlap an announced piece")
        self.announced.update(span)
        self.landed[seq] = self.block_ids[block_index:end]
        return self.landed[seq]

    def landed_pages(self, seq: int) -> list[int]:
        """The pages piece `seq` wrote (its entries the decode worker needs), in order."""
        return [page for page in self.landed[seq] if page != NULL_PAGE]

    def check_complete(self, num_pieces: int) -> None:
        """InvalidRequestError unless exactly pieces 0..num_pieces-1 were announced (at least
        one) and together they cover every reserved block."""
        if not 0 < num_pieces == len(self.pieces) or sorted(self.pieces) != list(range(num_pieces)):
            raise InvalidRequestError(f"{self.transfer_id}: completed with {num_pieces} pieces, "
                                      f"announced {sorted(self.pieces)[:8]} ({len(self.pieces)})")
        if len(self.announced) != len(self.block_ids) - self.cached_blocks:
            raise InvalidRequestError(f"{self.transfer_id}: pieces cover {len(self.announced)} of the "
                                      f"{len(self.block_ids) - self.cached_blocks} reserved blocks to write")

    async def check_sums(self, checksums: Sequence[int]) -> None:
        """ChecksumMismatch unless each piece's blocks, as landed, sum to its sender's sum.
        InvalidRequestError for a list that is not one sum per piece."""
        if len(checksums) != len(self.pieces):
            raise InvalidRequestError(f"{self.transfer_id}: {len(checksums)} checksums for {len(self.pieces)} pieces")
        for seq, expected in enumerate(checksums):
            got = await self.sums[seq]
            if expected != NONE and got != expected:
                raise ChecksumMismatch(f"{self.transfer_id}: piece {seq} landed with KV checksum {got:016x}, its "
                                       f"sender's is {expected:016x}: none of it is used")

    def failures(self) -> list[TransferError]:
        """Pieces that ended with a transfer error (their own deadline, a bad layout)."""
        done = [t for t in self.pieces.values() if t.done() and not t.cancelled()]
        return [e for e in (t.exception() for t in done) if isinstance(e, TransferError)]

    def first_failure(self) -> BaseException | None:
        """Once every piece is done: the first one's error, if any failed."""
        return next((t.exception() for t in self.pieces.values() if not t.cancelled() and t.exception()), None)
