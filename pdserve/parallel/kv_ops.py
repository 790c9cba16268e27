"""What rank 0 asks of a follower rank's KV agent (kv_agent.py), and the answers: the follower's
own KV transfer end, over its own heads' pool, driven from rank 0's event loop.

    rank 0 (its event loop)  --Call(token, op)-->           follower's agent (its own thread and loop)
                             <--Answer(token, value | failure)--

Each direction is a stream of frames over one socket pair made at spawn (leader.py): a 4-byte
little-endian length, then the pickle. Plans for the forward pass take another path (stdin);
KV calls never wait behind a step, and a step never waits behind a transfer.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from dataclasses import dataclass
from typing import Any, Protocol

from pdserve.transfer import (KVReceiver, KVSender, TransferCancelled, TransferError, TransferRejected,
                              TransferResult, TransferTimeout)
from pdserve.transfer.head_slices import HeadSlice

_LENGTH = struct.Struct("<I")
_ERRORS = {cls.__name__: cls for cls in (TransferError, TransferTimeout, TransferCancelled, TransferRejected)}
Pairs = tuple[tuple[int, int], ...]


class TransferEnds(Protocol):
    """What an op runs on: the follower's transfer ends over its own pool (kv_agent.py's KVAgent),
    each built on first use."""

    def receiver(self) -> KVReceiver: ...

    def sender(self) -> KVSender: ...


@dataclass(frozen=True)
class PieceSpec:
    """One piece between one pair of ranks (its transfer id already that pair's, kv_ranks.py)."""

    transfer_id: str
    seq: int
    pairs: Pairs
    timeout_s: float
    secret: bytes
    heads: HeadSlice | None  # None: whole blocks


@dataclass(frozen=True)
class OpenReceiver:
    async def run(self, agent: TransferEnds) -> bytes:
        """The receiver's address (built on first use)."""
        return agent.receiver().address()


@dataclass(frozen=True)
class OpenSender:
    async def run(self, agent: TransferEnds) -> None:
        agent.sender()


@dataclass(frozen=True)
class Expect:
    """Answered once the piece is in, held in the follower's staging buffer: nothing reaches
    its pool before rank 0 says `Land` (a piece withdrawn before that leaves no block unsafe)."""

    piece: PieceSpec

    async def run(self, agent: TransferEnds) -> TransferResult:
        p = self.piece
        return await agent.receiver().expect(p.transfer_id, p.seq, p.pairs, p.timeout_s, secret=p.secret,
                                             heads=p.heads, hold=True)


@dataclass(frozen=True)
class Land:
    """Unpack a held piece into the follower's pool (TransferCancelled: it was withdrawn)."""

    transfer_id: str
    seq: int

    async def run(self, agent: TransferEnds) -> None:
        agent.receiver().land(self.transfer_id, self.seq)


@dataclass(frozen=True)
class Send:
    address: bytes
    piece: PieceSpec

    async def run(self, agent: TransferEnds) -> TransferResult:
        p = self.piece
        return await agent.sender().send(self.address, p.transfer_id, p.seq, p.pairs, p.timeout_s,
                                         secret=p.secret, heads=p.heads)


@dataclass(frozen=True)
class Cancel:
    transfer_id: str

    async def run(self, agent: TransferEnds) -> int:
        """The pieces withdrawn. A follower's receives are held (Expect), so none of them leaves
        a block of its pool unsafe."""
        return agent.receiver().cancel(self.transfer_id).pieces


Op = OpenReceiver | OpenSender | Expect | Land | Send | Cancel


@dataclass(frozen=True)
class Failure:
    """An op's exception, as it crosses the socket (a transfer error keeps its kind and unsafe blocks)."""

    kind: str
    message: str
    unsafe_blocks: tuple[int, ...] = ()

    @classmethod
    def of(cls, exc: BaseException) -> "Failure":
        unsafe = tuple(getattr(exc, "unsafe_blocks", ()))
        return cls(type(exc).__name__, str(exc), unsafe)

    def error(self, rank: int) -> Exception:
        message = f"rank {rank}: {self.message}"
        if self.kind in _ERRORS:
            return _ERRORS[self.kind](message, self.unsafe_blocks)
        return RuntimeError(f"{message} ({self.kind})")


@dataclass(frozen=True)
class Call:
    token: int
    op: Op


@dataclass(frozen=True)
class Answer:
    token: int
    value: Any = None
    failure: Failure | None = None


def write_frame(writer: asyncio.StreamWriter, message: Call | Answer) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_LENGTH.pack(len(data)) + data)


async def read_frame(reader: asyncio.StreamReader) -> Call | Answer:
    """The next message; asyncio.IncompleteReadError at end-of-stream."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(length))
