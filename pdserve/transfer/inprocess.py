"""In-process transport: torch copies between pools of one process, for tests of the services.

Receivers register with an `InProcessFabric` that the caller passes explicitly to both sides;
an address is an opaque key into that fabric. The semantics follow the UCX transport: a sender
waits until its piece is expected under the secret it holds (or its deadline passes: a sender
with another secret never finds the piece, as its UCX tags would match no receive), copies run
by run, and a piece withdrawn by the receiver stops before the next run, so nothing is written
after `cancel` returns. A slice of heads (`head_slices`) is copied from the sender's strided
view into the receiver's. Everything runs on one asyncio loop.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import time
from dataclasses import dataclass, field

import torch

from pdserve.transfer.base import CancelResult, KVReceiver, KVSender, KVTransport, Pairs, TransferResult, pool_bytes
from pdserve.transfer.base import TransferCancelled, TransferError, TransferRejected, TransferTimeout
from pdserve.transfer.descriptors import BlockRun, check_bounds, merge_runs, split_runs, total_blocks
from pdserve.transfer.head_slices import HeadSlice, block_view, checked_slice, pool_shape, slice_nbytes
from pdserve.transfer.ledger import Ledger
from pdserve.transfer.wire import check_secret

Waiting = tuple[str, int, bytes]  # (transfer_id, seq, secret) a sender waits for


class InProcessFabric:
    """The registry the two sides meet in: address -> live receiver."""

    def __init__(self) -> None:
        self._receivers: dict[bytes, InProcessReceiver] = {}
        self._ids = itertools.count()

    def register(self, receiver: "InProcessReceiver") -> bytes:
        address = b"inprocess:%d" % next(self._ids)
        self._receivers[address] = receiver
        return address

    def unregister(self, address: bytes) -> None:
        self._receivers.pop(address, None)

    def lookup(self, address: bytes) -> "InProcessReceiver":
        receiver = self._receivers.get(address)
        if receiver is None:
            raise TransferError(f"no receiver at {address!r} (closed or never opened)")
        return receiver


@dataclass
class _Piece:
    transfer_id: str
    seq: int
    runs: tuple[BlockRun, ...]
    heads: HeadSlice
    slice_shape: tuple[int, ...]  # [layers, 2, block_size, heads, head_dim] of what lands per block
    secret: bytes = field(repr=False)
    started: float
    done: asyncio.Future = field(repr=False)


class InProcessReceiver(KVReceiver):
    def __init__(self, fabric: InProcessFabric, pool: torch.Tensor):
        self.pool = pool
        self.bytes = pool_bytes(pool)  # [num_blocks, block_nbytes] uint8
        self._fabric = fabric
        self._ledger: Ledger[_Piece] = Ledger(self.bytes.shape[0])
        self._waiters: dict[Waiting, list[asyncio.Future]] = {}
        self._address = fabric.register(self)
        self._closed = False

    def address(self) -> bytes:
        return self._address

    async def expect(self, transfer_id: str, seq: int, pairs: Pairs, timeout_s: float, *,
                     secret: bytes, heads: HeadSlice | None = None) -> TransferResult:
        if self._closed:
            raise TransferRejected("receiver closed")
        try:
            check_secret(secret)
            heads = checked_slice(self.pool, heads)
        except ValueError as exc:
            raise TransferRejected(str(exc)) from exc
        runs = merge_runs(pairs)
        piece = _Piece(transfer_id, seq, runs, heads, _slice_shape(self.pool, heads), secret, time.perf_counter(),
                       asyncio.get_running_loop().create_future())
        self._ledger.admit(transfer_id, seq, runs, piece, heads)
        self._wake_senders(piece)
        try:
            await asyncio.wait({piece.done}, timeout=timeout_s)
            self.finish(piece, TransferTimeout(f"piece ({transfer_id!r}, {seq}) timed out after {timeout_s} s"))
            return piece.done.result()
        finally:
            self.finish(piece, TransferCancelled("expect was cancelled"))
            self._ledger.remove(transfer_id, seq)

    def finish(self, piece: _Piece, outcome: TransferResult | TransferError) -> None:
        """Complete a piece once; a failed piece retires its transfer id."""
        if piece.done.done():
            return
        if isinstance(outcome, TransferResult):
            piece.done.set_result(outcome)
            return
        piece.done.set_exception(outcome)
        piece.done.exception()
        self._ledger.remove(piece.transfer_id, piece.seq)
        self._ledger.retire(piece.transfer_id)

    def cancel(self, transfer_id: str) -> CancelResult:
        pieces = self._ledger.pieces_of(transfer_id)
        for piece in pieces:
            self.finish(piece, TransferCancelled(f"transfer {transfer_id!r} cancelled"))
        self._ledger.retire(transfer_id)
        return CancelResult(transfer_id, len(pieces))

    async def close(self) -> None:
        self._closed = True
        self._fabric.unregister(self._address)
        for piece in self._ledger:
            self.finish(piece, TransferCancelled("receiver closed"))
        for waiters in self._waiters.values():
            for waiter in waiters:
                _resolve(waiter, TransferError("receiver closed"))

    async def posted(self, transfer_id: str, seq: int, secret: bytes, timeout_s: float) -> _Piece:
        """For senders: the live piece, once expected under `secret`; TransferTimeout if not
        within timeout_s."""
        piece = self._ledger.lookup(transfer_id, seq)
        if piece is not None and hmac.compare_digest(piece.secret, secret):
            return piece
        key = (transfer_id, seq, secret)
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, []).append(waiter)
        try:
            return await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            raise TransferTimeout(f"piece ({transfer_id!r}, {seq}) was never expected under this secret") from None
        finally:
            self._drop_waiter(key, waiter)

    def _wake_senders(self, piece: _Piece) -> None:
        for waiter in self._waiters.pop((piece.transfer_id, piece.seq, piece.secret), []):
            _resolve(waiter, piece)

    def _drop_waiter(self, key: Waiting, waiter: asyncio.Future) -> None:
        waiters = self._waiters.get(key, [])
        if waiter in waiters:
            waiters.remove(waiter)
        if not waiters:
            self._waiters.pop(key, None)


def _slice_shape(pool: torch.Tensor, heads: HeadSlice) -> tuple[int, ...]:
    return tuple(block_view(pool, 0, 1, heads).shape[1:])


def _resolve(waiter: asyncio.Future, value: object) -> None:
    if waiter.done():
        return
    if isinstance(value, BaseException):
        waiter.set_exception(value)
    else:
        waiter.set_result(value)


class InProcessSender(KVSender):
    """Copies at most max_copy_bytes (whole blocks) between yields to the loop."""

    def __init__(self, fabric: InProcessFabric, pool: torch.Tensor, max_copy_bytes: int = 16 << 20):
        self.pool = pool
        self.bytes = pool_bytes(pool)  # [num_blocks, block_nbytes] uint8
        self._fabric = fabric
        self._closed = False
        self._max_blocks = max(1, max_copy_bytes // self.bytes.shape[1])

    async def send(
        self, peer_address: bytes, transfer_id: str, seq: int, pairs: Pairs, timeout_s: float, *, secret: bytes,
        heads: HeadSlice | None = None
    ) -> TransferResult:
        started = time.perf_counter()
        check_secret(secret)
        heads = checked_slice(self.pool, heads)
        runs = merge_runs(pairs)
        check_bounds(runs, self.bytes.shape[0], "src")
        receiver = self._fabric.lookup(peer_address)
        piece = await receiver.posted(transfer_id, seq, secret, timeout_s)
        self._check_layout(receiver, piece, runs, heads)
        for run in split_runs(runs, self._max_blocks):
            self._check_live(piece, started, timeout_s)
            block_view(receiver.pool, run.dst_start, run.count, piece.heads).copy_(
                block_view(self.pool, run.src_start, run.count, heads))
            await asyncio.sleep(0)
        self._check_live(piece, started, timeout_s)
        nbytes = total_blocks(runs) * slice_nbytes(pool_shape(self.pool), heads, self.pool.element_size())
        receiver.finish(piece, TransferResult(transfer_id, seq, nbytes, runs, time.perf_counter() - piece.started))
        return TransferResult(transfer_id, seq, nbytes, runs, time.perf_counter() - started)

    def _check_layout(self, receiver: InProcessReceiver, piece: _Piece, runs: tuple[BlockRun, ...],
                      heads: HeadSlice) -> None:
        same_dtype = receiver.pool.dtype == self.pool.dtype
        if piece.runs == runs and piece.slice_shape == _slice_shape(self.pool, heads) and same_dtype:
            return
        error = TransferError(f"piece ({piece.transfer_id!r}, {piece.seq}): sender and receiver layouts differ")
        receiver.finish(piece, error)
        raise error

    def _check_live(self, piece: _Piece, started: float, timeout_s: float) -> None:
        if self._closed:
            raise TransferError("sender closed")
        if piece.done.done():
            raise TransferError(f"piece ({piece.transfer_id!r}, {piece.seq}) was withdrawn by the receiver")
        if time.perf_counter() - started > timeout_s:
            raise TransferTimeout(f"piece ({piece.transfer_id!r}, {piece.seq}) timed out while copying")

    async def close(self) -> None:
        self._closed = True


class InProcessTransport(KVTransport):
    def __init__(self, fabric: InProcessFabric):
        self.fabric = fabric

    def receiver(self, pool: torch.Tensor) -> InProcessReceiver:
        return InProcessReceiver(self.fabric, pool)

    def sender(self, pool: torch.Tensor) -> InProcessSender:
        return InProcessSender(self.fabric, pool)
