"""One rank's KV transfer end as rank 0 drives it: its own (LocalPort), or a follower's through
that rank's KV agent (FollowerPort). kv_ranks.py moves every piece over all of a worker's ports."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod

from pdserve.parallel.kv_link import FollowerLink
from pdserve.parallel.kv_ops import Cancel, Expect, PieceSpec, Send, Settled
from pdserve.parallel.ranks import RankFailed
from pdserve.transfer import CancelResult, KVReceiver, KVSender, TransferResult


class RankPort(ABC):
    @abstractmethod
    async def expect(self, piece: PieceSpec) -> TransferResult:
        """The rank's receiver expects `piece` (KVReceiver.expect)."""

    @abstractmethod
    async def send(self, address: bytes, piece: PieceSpec) -> TransferResult:
        """The rank's sender sends `piece` from its pool (KVSender.send)."""

    @abstractmethod
    def cancel(self, transfer_id: str, posted: tuple[int, ...]) -> CancelResult:
        """Withdraw the rank's pieces of `transfer_id` (KVReceiver.cancel); `posted`: the blocks
        its pieces still in flight write, for a rank that can only say later what is safe."""

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

    def cancel(self, transfer_id: str, posted: tuple[int, ...]) -> CancelResult:
        assert self.receiver is not None
        return self.receiver.cancel(transfer_id)

    async def close(self) -> None:
        for end in (self.receiver, self.sender):
            if end is not None:
                await end.close()


def _heads(piece: PieceSpec) -> dict:
    return {} if piece.heads is None else {"heads": piece.heads}


class FollowerPort(RankPort):
    def __init__(self, link: FollowerLink):
        self.link = link

    async def expect(self, piece: PieceSpec) -> TransferResult:
        return await self.link.call(Expect(piece))

    async def send(self, address: bytes, piece: PieceSpec) -> TransferResult:
        return await self.link.call(Send(address, piece))

    def cancel(self, transfer_id: str, posted: tuple[int, ...]) -> CancelResult:
        """Every block of the rank's pieces in flight stays unsafe until the rank answers that
        its withdrawn receives are over (never, when it cannot tell: then the quarantine's limit)."""
        answer = self.link.call(Cancel(transfer_id))
        if not posted:
            answer.add_done_callback(_consume)
            return CancelResult(transfer_id, 0)
        settled = asyncio.get_running_loop().create_future()
        answer.add_done_callback(lambda done: _settle(done, settled))
        return CancelResult(transfer_id, 1, posted, settled)

    async def close(self) -> None:
        await self.link.close()


def _consume(answer: asyncio.Future) -> None:
    if not answer.cancelled():
        answer.exception()


def _settle(answer: asyncio.Future, settled: asyncio.Future) -> None:
    """The rank's cancel is over (settled when it could tell), or the rank is gone (nothing of
    it can write any more)."""
    if answer.cancelled() or settled.done():
        return
    error = answer.exception()
    if isinstance(error, RankFailed) or (error is None and isinstance(answer.result(), Settled) and answer.result().known):
        settled.set_result(None)
