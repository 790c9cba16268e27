"""UCX transport (ucxx): tag messages straight from the sender's pool into the receiver's blocks.

A piece (transfer_id, seq, pairs) travels as one tag message per run (cut at max_message_bytes)
and a manifest message last (`wire`). The receiver posts one receive per message into the
exact byte range of its dst blocks, plus one for the manifest into a small buffer of its own.
A piece of some of a pool's heads (`head_slices`; tensor-parallel ranks of different sizes)
travels packed: the sender packs each run's slice into a buffer of its own, the receiver posts
into a staging buffer and unpacks into its blocks once the manifest matched (so nothing of a
withdrawn or mismatched piece ever reaches the pool). A receive may also be held (`hold=True`,
a tensor-parallel follower's): staged even when whole blocks, kept out of the pool until its
owner says `land`, so a piece withdrawn before that leaves no block unsafe.

How nothing unexpected lands in the pool: the receiver posts receives only in `expect`, each
with a full-mask tag of that piece, keyed by the transfer's secret (`wire`): only a sender that
holds the secret can name it. A message whose tag matches no posted receive stays in
UCX's unexpected queue (eager: copied into UCX's own buffers; rendezvous: only its header, the
data stays with the sender) and is never copied into the pool. A message longer than the range
it matched fails with a truncation error without writing past the range; a shorter one or one
cut differently is caught by the manifest, without which no piece completes.

Peer-failure detection is off on worker-address endpoints (the fast path), so every wait here
has a deadline; on a deadline or cancel the receiver cancels its posted receives and drains the
ones already matched before it returns, so the blocks can be reused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pdserve.transfer.base import (
    CancelResult,
    KVReceiver,
    KVSender,
    KVTransport,
    Pairs,
    TransferCancelled,
    TransferError,
    TransferRejected,
    TransferResult,
    TransferTimeout,
    pool_bytes,
    settled_all,
)
from pdserve.transfer.descriptors import (
    BlockRun,
    check_bounds,
    join_runs,
    plan_messages,
    runs_digest,
    total_blocks,
)
from pdserve.transfer.head_slices import HeadSlice, checked_slice, pack, pool_shape, slice_nbytes, unpack
from pdserve.transfer.ledger import Ledger
from pdserve.transfer.prefault import prefault
from pdserve.transfer.ucx_worker import Batch, Endpoint, UcxWorker
from pdserve.transfer.wire import (
    MANIFEST_NBYTES,
    PieceKeys,
    check_message_count,
    encode_manifest,
    piece_key,
    piece_tags,
)


@dataclass(frozen=True)
class UcxConfig:
    max_message_bytes: int = 8 << 20  # bounds one message, hence one progress call's copy
    poll_s: float = 0.002  # progress at least this often while requests are pending
    idle_s: float = 0.1  # ... and this often when idle (epoll wakes it sooner)
    slice_s: float = 0.001  # progress this long before yielding to other tasks
    drain_s: float = 0.5  # how long a cancel waits for a receive already being written
    close_s: float = 1.0  # how long closing an endpoint may wait for the peer
    options: tuple[tuple[str, str], ...] = ()  # UCX context options, e.g. (("TLS", "tcp"),)

    def worker(self) -> UcxWorker:
        return UcxWorker(dict(self.options), self.poll_s, self.idle_s, self.slice_s)


def _buffer(rows: torch.Tensor) -> Any:
    """What ucxx takes for a contiguous byte range: numpy on CPU, the tensor itself on CUDA."""
    flat = rows.reshape(-1)
    return flat.numpy() if flat.device.type == "cpu" else flat


def _plan(pairs: Pairs, block_nbytes: int, config: UcxConfig) -> tuple[BlockRun, ...]:
    messages = plan_messages(pairs, block_nbytes, config.max_message_bytes)
    check_message_count(len(messages))
    return messages


def _manifest(messages: tuple[BlockRun, ...], block_nbytes: int) -> bytes:
    return encode_manifest(total_blocks(messages) * block_nbytes, runs_digest(messages, block_nbytes))


@dataclass(eq=False)
class _Piece:
    transfer_id: str
    seq: int
    messages: tuple[BlockRun, ...]
    expected: bytes
    manifest: np.ndarray  # [MANIFEST_NBYTES] uint8, what arrived
    key: int  # the tag key of its messages
    heads: HeadSlice
    staging: torch.Tensor | None = None  # [blocks, slice_nbytes] uint8 for a packed slice or a held piece
    held: bool = False  # staged until `land`, not unpacked when the manifest matched
    started: float = field(default_factory=time.perf_counter)
    batch: Batch | None = None

    def name(self) -> str:
        return f"piece ({self.transfer_id!r}, {self.seq})"


def _slice_nbytes(pool: torch.Tensor, heads: HeadSlice) -> int:
    return slice_nbytes(pool_shape(pool), heads, pool.element_size())


class UcxReceiver(KVReceiver):
    def __init__(self, pool: torch.Tensor, config: UcxConfig):
        self.pool = pool
        self.bytes = pool_bytes(pool)  # [num_blocks, block_nbytes] uint8
        prefault(self.bytes)  # first-touch faults now, not mid-transfer
        self._config = config
        self._worker = config.worker()
        self._ledger: Ledger[_Piece] = Ledger(self.bytes.shape[0])
        self._keys = PieceKeys()
        self._held: dict[tuple[str, int], _Piece] = {}  # (transfer_id, seq) -> staged, matched, not landed
        self._address = self._worker.address()
        self._closed = False

    def address(self) -> bytes:
        return self._address

    async def expect(self, transfer_id: str, seq: int, pairs: Pairs, timeout_s: float, *,
                     secret: bytes, heads: HeadSlice | None = None, hold: bool = False) -> TransferResult:
        """`hold`: the piece, once matched, waits in its staging buffer for `land` (nothing of it
        is in the pool before; `cancel` drops it)."""
        piece = self._post(transfer_id, seq, pairs, secret, heads, hold)
        try:
            if not await self._worker.wait(piece.batch, timeout_s):
                raise self._withdraw(piece, TransferTimeout(f"{piece.name()} timed out after {timeout_s} s"))
            return self._result(piece)
        finally:
            if not piece.batch.future.done():
                self._withdraw(piece, TransferCancelled(f"{piece.name()}: expect was cancelled"))
            self._forget(piece)

    def land(self, transfer_id: str, seq: int) -> None:
        """Unpack a held piece into the pool. TransferCancelled when it was withdrawn (or never held)."""
        piece = self._held.pop((transfer_id, seq), None)
        if piece is None:
            raise TransferCancelled(f"piece ({transfer_id!r}, {seq}) is not held here (withdrawn)")
        self._unpack(piece)

    def _post(self, transfer_id: str, seq: int, pairs: Pairs, secret: bytes, heads: HeadSlice | None,
              hold: bool) -> _Piece:
        if self._closed:
            raise TransferRejected("receiver closed")
        try:
            heads = checked_slice(self.pool, heads)
            block_nbytes = _slice_nbytes(self.pool, heads)
            messages = _plan(pairs, block_nbytes, self._config)
            key = piece_key(secret, transfer_id, seq)
            tags = piece_tags(key, len(messages))
        except ValueError as exc:
            raise TransferRejected(str(exc)) from exc
        piece = _Piece(transfer_id, seq, messages, _manifest(messages, block_nbytes),
                       np.zeros(MANIFEST_NBYTES, np.uint8), key, heads, held=hold)
        self._ledger.admit(transfer_id, seq, messages, piece, heads)
        if not self._keys.acquire(key, piece):
            self._ledger.remove(transfer_id, seq)
            raise TransferRejected(f"{piece.name()}: tag key collides with a live piece")
        buffers = self._targets(piece, block_nbytes)
        try:
            piece.batch = self._worker.recv(list(zip(buffers + [piece.manifest], tags)))
        except Exception as exc:
            self._forget(piece)
            raise TransferError(f"{piece.name()}: cannot post receives: {exc}") from exc
        return piece

    def _targets(self, piece: _Piece, block_nbytes: int) -> list[Any]:
        """Where each message lands: its dst blocks, or for a packed slice its rows of the staging buffer."""
        if piece.heads.is_whole(self.pool.shape[4]) and not piece.held:
            return [_buffer(self.bytes[m.dst_start : m.dst_start + m.count]) for m in piece.messages]
        piece.staging = torch.empty((total_blocks(piece.messages), block_nbytes), dtype=torch.uint8,
                                    device=self.pool.device)
        starts = np.cumsum([0] + [m.count for m in piece.messages])
        return [_buffer(piece.staging[a:b]) for a, b in zip(starts[:-1], starts[1:])]

    def _unpack(self, piece: _Piece) -> None:
        row = 0
        for m in piece.messages:
            unpack(self.pool, m.dst_start, piece.heads, piece.staging[row : row + m.count])
            row += m.count

    def _forget(self, piece: _Piece) -> None:
        if self._ledger.lookup(piece.transfer_id, piece.seq) is piece:
            self._ledger.remove(piece.transfer_id, piece.seq)
        self._keys.release(piece.key, piece)

    def _result(self, piece: _Piece) -> TransferResult:
        error = piece.batch.future.exception()
        if isinstance(error, TransferError):
            raise error
        if error is not None:
            raise self._withdraw(piece, TransferError(f"{piece.name()} failed: {error}"))
        if piece.manifest.tobytes() != piece.expected:
            self._ledger.retire(piece.transfer_id)
            raise TransferError(f"{piece.name()}: the sender's layout or block size differs")
        if piece.held:
            self._held[(piece.transfer_id, piece.seq)] = piece
        elif piece.staging is not None:
            self._unpack(piece)
        nbytes = total_blocks(piece.messages) * _slice_nbytes(self.pool, piece.heads)
        return TransferResult(piece.transfer_id, piece.seq, nbytes, join_runs(piece.messages),
                              time.perf_counter() - piece.started)

    def _withdraw(self, piece: _Piece, error: TransferError) -> TransferError:
        """Cancel what the piece posted, fail it with `error` (+ unsafe blocks), retire its id."""
        stuck = self._worker.withdraw(piece.batch, self._config.drain_s)
        self._forget(piece)
        into_pool = piece.staging is None  # a staged receive writes only its own buffer, kept until it settles
        error.unsafe_blocks = tuple(
            b for i in stuck if into_pool and i < len(piece.messages) for b in piece.messages[i].dst_blocks()
        )
        settled = self._worker.settling(piece.batch, stuck) if stuck else None
        error.settled = settled if error.unsafe_blocks else None
        piece.batch.fail(error)
        self._ledger.retire(piece.transfer_id)
        return error

    def cancel(self, transfer_id: str) -> CancelResult:
        """Withdraws the transfer's posted pieces and drops its held ones (never in the pool)."""
        pieces = self._ledger.pieces_of(transfer_id)
        errors = [self._withdraw(p, TransferCancelled(f"{p.name()} cancelled")) for p in pieces]
        self._ledger.retire(transfer_id)
        held = [key for key in self._held if key[0] == transfer_id]
        for key in held:
            del self._held[key]
        unsafe = [e for e in errors if e.unsafe_blocks]
        return CancelResult(transfer_id, len(pieces) + len(held), tuple(b for e in unsafe for b in e.unsafe_blocks),
                            settled_all([e.settled for e in unsafe]))

    async def close(self) -> None:
        self._closed = True
        self._held.clear()
        for piece in self._ledger:
            if not piece.batch.future.done():
                self._withdraw(piece, TransferCancelled(f"{piece.name()}: receiver closed"))
        await self._worker.close(self._config.drain_s)


class UcxSender(KVSender):
    def __init__(self, pool: torch.Tensor, config: UcxConfig):
        self.pool = pool
        self.bytes = pool_bytes(pool)  # [num_blocks, block_nbytes] uint8
        self._config = config
        self._worker = config.worker()
        self._endpoints: dict[bytes, Endpoint] = {}
        self._closed = False

    async def send(
        self, peer_address: bytes, transfer_id: str, seq: int, pairs: Pairs, timeout_s: float, *, secret: bytes,
        heads: HeadSlice | None = None
    ) -> TransferResult:
        deadline = time.monotonic() + timeout_s
        started = time.perf_counter()
        heads = checked_slice(self.pool, heads)
        block_nbytes = _slice_nbytes(self.pool, heads)
        messages = _plan(pairs, block_nbytes, self._config)
        check_bounds(messages, self.bytes.shape[0], "src")
        tags = piece_tags(piece_key(secret, transfer_id, seq), len(messages))
        name = f"piece ({transfer_id!r}, {seq})"
        endpoint = self._endpoint(peer_address)
        data = list(zip(self._sources(messages, heads), tags))
        await self._finish(peer_address, self._worker.send(endpoint, data), deadline, name)
        manifest = np.frombuffer(_manifest(messages, block_nbytes), np.uint8).copy()
        batch = self._worker.send(endpoint, [(manifest, tags[-1])])
        await self._finish(peer_address, batch, deadline, name)
        nbytes = total_blocks(messages) * block_nbytes
        return TransferResult(transfer_id, seq, nbytes, join_runs(messages), time.perf_counter() - started)

    def _sources(self, messages: tuple[BlockRun, ...], heads: HeadSlice) -> list[Any]:
        """Each message's bytes: its src blocks, or a packed copy of their slice of heads."""
        if heads.is_whole(self.pool.shape[4]):
            return [_buffer(self.bytes[m.src_start : m.src_start + m.count]) for m in messages]
        return [_buffer(pack(self.pool, m.src_start, m.count, heads).view(torch.uint8)) for m in messages]

    def _endpoint(self, peer_address: bytes) -> Endpoint:
        if self._closed:
            raise TransferError("sender closed")
        if peer_address not in self._endpoints:
            try:
                self._endpoints[peer_address] = self._worker.connect(peer_address)
            except Exception as exc:
                raise TransferError(f"cannot reach peer: {exc}") from exc
        return self._endpoints[peer_address]

    async def _finish(self, peer_address: bytes, batch: Batch, deadline: float, name: str) -> None:
        if not await self._worker.wait(batch, deadline - time.monotonic()):
            self._worker.abandon(batch, TransferTimeout(f"{name} timed out"))
            raise TransferTimeout(f"{name}: not delivered by the deadline (peer gone or piece not expected)")
        error = batch.future.exception()
        if isinstance(error, TransferError):
            raise error
        if error is not None:
            await self._drop_endpoint(peer_address)
            raise TransferError(f"{name} failed: {error}") from error

    async def _drop_endpoint(self, peer_address: bytes) -> None:
        endpoint = self._endpoints.pop(peer_address, None)
        if endpoint is not None:
            await self._worker.close_endpoint(endpoint, self._config.close_s)

    async def close(self) -> None:
        self._closed = True
        self._worker.fail_all(TransferError("sender closed"))
        for peer_address in list(self._endpoints):
            await self._drop_endpoint(peer_address)
        await self._worker.close(self._config.drain_s)


class UcxTransport(KVTransport):
    def __init__(self, config: UcxConfig = UcxConfig()):
        self.config = config

    def receiver(self, pool: torch.Tensor) -> UcxReceiver:
        return UcxReceiver(pool, self.config)

    def sender(self, pool: torch.Tensor) -> UcxSender:
        return UcxSender(pool, self.config)
