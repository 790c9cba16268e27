"""One rank's KV transfer end as rank 0 drives it: its own (LocalPort), or a follower's through
that rank's KV agent (FollowerPort). kv_ranks.py moves every piece over all of a worker's ports."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod

from pdserve.parallel.kv_link import FollowerLink
from pdserve.parallel.kv_ops import Cancel, Expect, Land, PieceSpec, Send
from pdserve.transfer import CancelResult, KVReceiver, KVSender, TransferResult


class RankPort(ABC):
    @abstractmethod
    async def expect(self, piece: PieceSpec) -> TransferResult:
        """The rank's receiver expects `piece` (KVReceiver.expect)."""

    @abstractmethod
    async def send(self, address: bytes, piece: PieceSpec) -> TransferResult:
        """The rank's sender sends `piece` from its pool (KVSender.send)."""

    @abstractmethod
    def cancel(self, transfer_id: str) -> CancelResult:
        """Withdraw the rank's pieces of `transfer_id` (KVReceiver.cancel)."""

    @abstractmethod
    async def close(self) -> None:
        """Close the rank's ends (the local ones) or the link to them."""


class LocalPort(RankPort):
    """Rank 0's own ends; whole-block pieces are called exactly as at tensor parallel size 1."""

    def __init__(self, receiver: KVReceiver | None = None, sender: KVSender | None = None):
        self.receiver, self.sender = receiver, sender

    async def expect(self, piece: PieceSpec) -> TransferResult:
        assert self.receiver is not None
        return await self.receiver.expect(piece.transfer_id, piece.seq, list(piece.pairs), piece.timeout_s,
                                          secret=piece.secret, **_heads(piece))

    async def send(self, address: bytes, piece: PieceSpec) -> TransferResult:
        assert self.sender is not None
        return await self.sender.send(address, piece.transfer_id, piece.seq, list(piece.pairs), piece.timeout_s,
                                      secret=piece.secret, **_heads(piece))

    def cancel(self, transfer_id: str) -> CancelResult:
        assert self.receiver is not None
        return self.receiver.cancel(transfer_id)

    async def close(self) -> None:
        for end in (self.receiver, self.sender):
            if end is not None:
                await end.close()


def _heads(piece: PieceSpec) -> dict:
    return {} if piece.heads is None else {"heads": piece.heads}


class FollowerPort(RankPort):
    """A follower's pieces land in two steps, both asked by rank 0: Expect (the piece arrives
    into the follower's staging buffer) then Land (it is unpacked into the pool). Only a piece
    told to land can write the pool, so a withdrawn transfer leaves unsafe only the blocks of
    pieces landing at that moment, until their Land is answered (or the rank is gone)."""

    def __init__(self, link: FollowerLink):
        self.link = link
        self._landing: dict[str, dict[int, tuple[tuple[int, ...], asyncio.Future]]] = {}  # id -> seq -> (blocks, Land)

    async def expect(self, piece: PieceSpec) -> TransferResult:
        result = await self.link.call(Expect(piece))
        landing = self.link.call(Land(piece.transfer_id, piece.seq))
        pieces = self._landing.setdefault(piece.transfer_id, {})
        pieces[piece.seq] = (tuple(dst for _, dst in piece.pairs), landing)
        landing.add_done_callback(lambda _: self._landed(piece.transfer_id, piece.seq, landing))
        await asyncio.shield(landing)
        return result

    def _landed(self, transfer_id: str, seq: int, landing: asyncio.Future) -> None:
        _consume(landing)
        pieces = self._landing.get(transfer_id, {})
        if seq in pieces and pieces[seq][1] is landing:
            del pieces[seq]
        if not pieces:
            self._landing.pop(transfer_id, None)

    async def send(self, address: bytes, piece: PieceSpec) -> TransferResult:
        return await self.link.call(Send(address, piece))

    def cancel(self, transfer_id: str) -> CancelResult:
        """Nothing unsafe unless a piece is landing: its blocks until its Land is answered."""
        self.link.call(Cancel(transfer_id)).add_done_callback(_consume)
        landing = list(self._landing.get(transfer_id, {}).values())
        if not landing:
            return CancelResult(transfer_id, 0)
        blocks = tuple(sorted({b for piece_blocks, _ in landing for b in piece_blocks}))
        settled = asyncio.gather(*(future for _, future in landing), return_exceptions=True)
        return CancelResult(transfer_id, len(landing), blocks, settled)

    async def close(self) -> None:
        await self.link.close()


def _consume(answer: asyncio.Future) -> None:
    if not answer.cancelled():
        answer.exception()
