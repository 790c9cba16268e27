"""A worker's KV transfer over all of its tensor-parallel ranks: each rank sends or receives
exactly its own heads' share, from or into its own pool, with nothing gathered on rank 0.

    prefill rank k of p holds heads rank_heads(H, p, k); decode rank j of d, rank_heads(H, d, j)
    one piece (transfer_id, seq, pairs) = for every (k, j) that share heads, one piece between them:
        transfer id   transfer_id for k = 0, f"{transfer_id}/{k}" otherwise (its own tags)
        heads         the share's slice on each side; None where it is the rank's whole pool
        blocks        the same pairs on every rank (the ranks of a worker share one block table)
    p = d: only (k, k), whole blocks: one transfer per rank pair, the messages of size 1
    size 1 on both sides: exactly the calls of an untensored worker

Rank 0 drives every rank's end (kv_ports.py), its own directly, a follower's through its agent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.parallel.kv_link import FollowerLink
from pdserve.parallel.kv_ops import OpenReceiver, OpenSender, PieceSpec
from pdserve.parallel.kv_ports import FollowerPort, LocalPort, RankPort
from pdserve.parallel.ranks import RankGroup
from pdserve.transfer import CancelResult, KVReceiver, KVSender, TransferResult, settled_all
from pdserve.transfer.head_slices import HeadRange, HeadSlice, Share, rank_heads, share

MAX_RANKS = 256


@dataclass(frozen=True)
class RankEnd:
    """A receiving rank as a reservation names it: its address and the model's heads it holds."""

    address: bytes
    heads: HeadRange


def rank_transfer_id(transfer_id: str, sender_rank: int) -> str:
    return transfer_id if sender_rank == 0 else f"{transfer_id}/{sender_rank}"


def check_ends(ends: Sequence[RankEnd], num_heads: int) -> None:
    """ValueError unless `ends` hold equal, contiguous shares of heads [0, num_heads), in order."""
    if not 0 < len(ends) <= MAX_RANKS:
        raise ValueError(f"{len(ends)} decode ranks; 1..{MAX_RANKS}")
    expected = [rank_heads(num_heads, len(ends), j) if num_heads % len(ends) == 0 else None
                for j in range(len(ends))]
    if [e.heads for e in ends] != expected:
        raise ValueError(f"decode ranks hold heads {[tuple(e.heads) for e in ends][:8]}, not equal shares of "
                         f"the {num_heads} KV heads here")


def _whole(part: HeadSlice, per_rank: int) -> HeadSlice | None:
    return None if part.is_whole(per_rank) else part


async def _all(moves: list) -> list[TransferResult]:
    """One move awaited in place (in this task's step, as an untensored worker's call), several together."""
    if len(moves) == 1:
        return [await moves[0]]
    return list(await asyncio.gather(*moves))


def _joined(transfer_id: str, seq: int, results: Sequence[TransferResult], started: float) -> TransferResult:
    runs = tuple(run for r in results for run in r.runs)
    return TransferResult(transfer_id, seq, sum(r.nbytes for r in results), runs, time.perf_counter() - started)


class RanksSender:
    """The prefill side. `rank_bytes[k]`: KV bytes rank k sent (its own heads only)."""

    def __init__(self, ports: Sequence[RankPort], heads_per_rank: int):
        self.ports = list(ports)
        self.heads_per_rank = heads_per_rank
        self.rank_bytes = [0] * len(self.ports)

    @classmethod
    def alone(cls, sender: KVSender, heads: int) -> "RanksSender":
        return cls([LocalPort(sender=sender)], heads)

    @property
    def num_heads(self) -> int:
        return self.heads_per_rank * len(self.ports)

    def ends_of(self, ranks: Sequence[RankEnd], kv_address: bytes) -> tuple[RankEnd, ...]:
        """A reservation's ranks; none listed: one rank holding every head at `kv_address`."""
        return tuple(ranks) or (RankEnd(kv_address, HeadRange(0, self.num_heads)),)

    async def send(self, ends: Sequence[RankEnd], transfer_id: str, seq: int, pairs: Sequence[tuple[int, int]],
                   timeout_s: float, *, secret: bytes) -> TransferResult:
        """Every rank's share of the piece to every decode rank holding some of it (ends
        checked by `check_ends`); TransferError / RankFailed as the first that failed."""
        started, size = time.perf_counter(), len(self.ports)
        moves = [(k, end, s) for k in range(size) for end in ends
                 if (s := share(rank_heads(self.num_heads, size, k), end.heads)) is not None]
        results = await _all([self._send(k, end, s, transfer_id, seq, tuple(pairs), timeout_s, secret)
                              for k, end, s in moves])
        return _joined(transfer_id, seq, results, started)

    async def _send(self, rank: int, end: RankEnd, s: Share, transfer_id: str, seq: int, pairs, timeout_s: float,
                    secret: bytes) -> TransferResult:
        piece = PieceSpec(rank_transfer_id(transfer_id, rank), seq, pairs, timeout_s, secret,
                          _whole(s.sender, self.heads_per_rank))
        result = await self.ports[rank].send(end.address, piece)
        self.rank_bytes[rank] += result.nbytes
        return result

    async def close(self) -> None:
        for port in self.ports:
            await port.close()


class RanksReceiver:
    """The decode side. `rank_bytes[j]`: KV bytes rank j received (its own heads only)."""

    def __init__(self, ports: Sequence[RankPort], addresses: Sequence[bytes], heads_per_rank: int):
        self.ports = list(ports)
        self.heads_per_rank = heads_per_rank
        size = len(self.ports)
        self.ends = tuple(RankEnd(a, rank_heads(heads_per_rank * size, size, j)) for j, a in enumerate(addresses))
        self.rank_bytes = [0] * size
        self._in_flight: dict[str, set[tuple[int, str, int]]] = {}  # transfer id -> (rank, its id there, seq)

    @classmethod
    def alone(cls, receiver: KVReceiver, heads: int) -> "RanksReceiver":
        return cls([LocalPort(receiver=receiver)], [receiver.address()], heads)

    @property
    def num_heads(self) -> int:
        return self.heads_per_rank * len(self.ports)

    def address(self) -> bytes:
        return self.ends[0].address

    def check_senders(self, senders: int) -> None:
        """ValueError unless a prefill worker at tensor parallel size `senders` can fill this one."""
        if not 0 < senders <= MAX_RANKS or self.num_heads % senders:
            raise ValueError(f"a prefill worker at tensor parallel size {senders}: it must divide the "
                             f"{self.num_heads} KV heads")

    async def expect(self, transfer_id: str, seq: int, pairs: Sequence[tuple[int, int]], timeout_s: float, *,
                     secret: bytes, senders: int = 1) -> TransferResult:
        """Every rank expects its share of the piece from every sending rank holding some of it."""
        started = time.perf_counter()
        moves = [(j, k, s) for j, end in enumerate(self.ends) for k in range(senders)
                 if (s := share(rank_heads(self.num_heads, senders, k), end.heads)) is not None]
        results = await _all([self._expect(j, k, s, transfer_id, seq, tuple(pairs), timeout_s, secret)
                              for j, k, s in moves])
        return _joined(transfer_id, seq, results, started)

    async def _expect(self, rank: int, sender: int, s: Share, transfer_id: str, seq: int, pairs, timeout_s: float,
                      secret: bytes) -> TransferResult:
        piece = PieceSpec(rank_transfer_id(transfer_id, sender), seq, pairs, timeout_s, secret,
                          _whole(s.receiver, self.heads_per_rank))
        key = (rank, piece.transfer_id, seq)
        self._in_flight.setdefault(transfer_id, set()).add(key)
        try:
            result = await self.ports[rank].expect(piece)
        finally:
            self._forget(transfer_id, key)
        self.rank_bytes[rank] += result.nbytes
        return result

    def _forget(self, transfer_id: str, key: tuple[int, str, int]) -> None:
        pieces = self._in_flight.get(transfer_id)
        if pieces is not None:
            pieces.discard(key)
            if not pieces:
                del self._in_flight[transfer_id]

    def cancel(self, transfer_id: str) -> CancelResult:
        """Withdraw the transfer on every rank that has pieces of it (and retire it on rank 0)."""
        pieces = self._in_flight.pop(transfer_id, set())
        ends = dict.fromkeys([(0, transfer_id), *sorted((rank, rank_id) for rank, rank_id, _ in pieces)])
        results = [self.ports[rank].cancel(rank_id) for rank, rank_id in ends]
        if len(results) == 1:
            return results[0]
        unsafe = [r for r in results if r.unsafe_blocks]
        return CancelResult(transfer_id, sum(r.pieces for r in results),
                            tuple(sorted({b for r in unsafe for b in r.unsafe_blocks})),
                            settled_all([r.settled for r in unsafe]))

    async def close(self) -> None:
        for port in self.ports:
            await port.close()


async def open_sender(local: KVSender, ranks: RankGroup, heads_per_rank: int) -> RanksSender:
    """Rank 0's sender and each follower's (built by its agent), as one."""
    links = [await FollowerLink.connect(rank, sock) for rank, sock in enumerate(ranks.kv_sockets(), start=1)]
    await asyncio.gather(*(link.call(OpenSender()) for link in links))
    return RanksSender([LocalPort(sender=local), *map(FollowerPort, links)], heads_per_rank)


async def open_receiver(local: KVReceiver, ranks: RankGroup, heads_per_rank: int) -> RanksReceiver:
    """Rank 0's receiver and each follower's (built by its agent, its address asked), as one."""
    links = [await FollowerLink.connect(rank, sock) for rank, sock in enumerate(ranks.kv_sockets(), start=1)]
    addresses = await asyncio.gather(*(link.call(OpenReceiver()) for link in links))
    return RanksReceiver([LocalPort(receiver=local), *map(FollowerPort, links)], [local.address(), *addresses],
                         heads_per_rank)
