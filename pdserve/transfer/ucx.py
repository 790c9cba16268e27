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

import asyncio
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from pdserve.transfer.base import (
    CancelResult,
    KVReceiver,
    KVSender,
    KVTransport,
    Pairs,
    PeerListener,
    TransferCancelled,
    TransferError,
    TransferRejected,
    TransferResult,
    TransferTimeout,
    TransferUnreachable,
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
from pdserve.transfer.prefault import prefault_behind
from pdserve.transfer.ucx_paths import (
    Locality,
    Path,
    PeerPath,
    choose_path,
    context_options,
    describe_path,
    peer_label,
    split_address,
    with_locality,
)
from pdserve.transfer.ucx_worker import Batch, Endpoint, NativeWorker, UcxWorker
from pdserve.transfer.wire import (
    MANIFEST_NBYTES,
    PieceKeys,
    check_message_count,
    encode_manifest,
    piece_key,
    piece_tags,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UcxConfig:
    max_message_bytes: int = 8 << 20  # bounds one message, hence one progress call's copy
    poll_s: float = 0.002  # progress at least this often while requests are pending
    idle_s: float = 0.1  # ... and this often when idle (epoll wakes it sooner)
    slice_s: float = 0.001  # progress this long before yielding to other tasks
    drain_s: float = 0.5  # how long a cancel waits for a receive already being written
    close_s: float = 1.0  # how long closing an endpoint may wait for the peer
    options: tuple[tuple[str, str], ...] = ()  # UCX context options, e.g. (("TLS", "tcp"),)
    connect_s: float = 5.0  # how long a peer nothing reached yet has to take a piece's first message
    floor_bytes_per_s: float = 50e6  # ... plus that message's bytes at this rate

    def options_for(self, path: Path) -> dict[str, str]:
        """The UCX context options of a worker on `path` (`ucx_paths`)."""
        return context_options(path, dict(self.options), os.environ)

    def worker(self) -> UcxWorker:
        """A receiver's worker: every transport, so that a sender on any path can reach it."""
        return UcxWorker.open(self.options_for(Path.HOST), self.poll_s, self.idle_s, self.slice_s)

    def adopt(self, native: NativeWorker) -> UcxWorker:
        return UcxWorker(native, self.poll_s, self.idle_s, self.slice_s)


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
        prefault_behind(self.bytes)  # first-touch faults before transfers, off the start's path
        self._config = config
        self._worker = config.worker()
        self._ledger: Ledger[_Piece] = Ledger(self.bytes.shape[0])
        self._keys = PieceKeys()
        self._held: dict[tuple[str, int], _Piece] = {}  # (transfer_id, seq) -> staged, matched, not landed
        self._address = with_locality(Locality.of_this_process(), self._worker.address())
        self._closed = False

    def address(self) -> bytes:
        """The UCX worker address, with where this process lives in front (`ucx_paths`)."""
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


@dataclass(eq=False)
class _Peer:
    """One receiver this sender reached: a UCX worker of its own, on the path chosen for the peer
    (so that connecting, which may block while the peer's host is resolved, runs off the loop and
    a broken peer is dropped whole), and whether anything was ever delivered to it (until then, a
    send has `connect_s` to start)."""

    label: str
    path: PeerPath
    worker: UcxWorker
    proven: bool = False

    @property
    def endpoint(self) -> Endpoint:
        return self.worker.endpoint()


def _off_loop(fn: Callable[..., Any], *args: Any) -> asyncio.Future:
    """`fn(*args)` on a daemon thread of its own: a connect UCX blocks in (for as long as the
    peer's host takes to be found unreachable) neither holds the loop nor the process's exit."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # handed to the loop, raised there
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: nobody will adopt it
            if error is None:
                result.destroy()

    threading.Thread(target=run, name="ucx-connect", daemon=True).start()
    return future


class UcxSender(KVSender):
    """Sends from one pool, to each peer over the path chosen for it (`ucx_paths`)."""

    def __init__(self, pool: torch.Tensor, config: UcxConfig):
        self.pool = pool
        self.bytes = pool_bytes(pool)  # [num_blocks, block_nbytes] uint8
        self._config = config
        self._locality = Locality.of_this_process()
        self._peers: dict[bytes, _Peer] = {}
        self._connecting: dict[bytes, asyncio.Future] = {}  # peer address -> its connection being made
        self.paths: dict[str, PeerPath] = {}  # peer label -> the path chosen for it, every peer ever reached
        self._listeners: list[PeerListener] = []
        self._closed = False

    def on_peer(self, listener: PeerListener) -> None:
        self._listeners.append(listener)

    def _tell(self, label: str, path: PeerPath, reached: bool) -> None:
        for listener in self._listeners:
            listener(label, path.path.value, path.transports, reached)

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
        peer = await self._peer(peer_address)
        data = list(zip(self._sources(messages, heads), tags))
        await self._start(peer, peer.worker.send(peer.endpoint, data[:1]), deadline, name,
                          messages[0].count * block_nbytes)
        if len(data) > 1:
            await self._finish(peer, peer.worker.send(peer.endpoint, data[1:]), deadline, name)
        manifest = np.frombuffer(_manifest(messages, block_nbytes), np.uint8).copy()
        await self._finish(peer, peer.worker.send(peer.endpoint, [(manifest, tags[-1])]), deadline, name)
        nbytes = total_blocks(messages) * block_nbytes
        return TransferResult(transfer_id, seq, nbytes, join_runs(messages), time.perf_counter() - started)

    async def _peer(self, peer_address: bytes) -> _Peer:
        """The peer's connection; the first send to it connects, within `connect_s`."""
        if self._closed:
            raise TransferError("sender closed")
        if peer_address in self._peers:
            return self._peers[peer_address]
        locality, ucx_address = split_address(peer_address)
        label = peer_label(ucx_address)
        path = describe_path(choose_path(self._locality, locality), dict(self._config.options), os.environ)
        try:
            return await asyncio.wait_for(asyncio.shield(self._connect(peer_address, label, path)),
                                          self._config.connect_s)
        except asyncio.TimeoutError:
            self._tell(label, path, reached=False)
            raise TransferUnreachable(f"peer {label}: no connection over the {path} within "
                                      f"{self._config.connect_s:g} s") from None
        except TransferError:
            raise
        except Exception as exc:
            raise TransferError(f"cannot reach peer {label} over the {path}: {exc}") from exc

    def _connect(self, peer_address: bytes, label: str, path: PeerPath) -> asyncio.Future:
        """The peer's connection as it is made, once, off the loop (a send that stopped waiting
        leaves it going: made late, it is kept for the next send)."""
        connecting = self._connecting.get(peer_address)
        if connecting is None:
            connecting = self._connecting[peer_address] = asyncio.get_running_loop().create_future()
            _, ucx_address = split_address(peer_address)
            made = _off_loop(NativeWorker.connected, self._config.options_for(path.path), ucx_address)
            made.add_done_callback(lambda m: self._made(peer_address, label, path, m, connecting))
        return connecting

    def _made(self, peer_address: bytes, label: str, path: PeerPath, made: asyncio.Future,
              connecting: asyncio.Future) -> None:
        self._connecting.pop(peer_address, None)
        error = made.exception()
        if error is None and self._closed:
            made.result().destroy()
            error = TransferError("sender closed")
        if error is not None:
            connecting.set_exception(error)
            connecting.exception()  # retrieved: nobody may be waiting any more
            return
        peer = self._peers[peer_address] = _Peer(label, path, self._config.adopt(made.result()))
        self.paths[peer.label] = peer.path
        self._tell(peer.label, peer.path, reached=True)
        log.info("KV to peer %s: %s", peer.label, peer.path)
        connecting.set_result(peer)

    def _sources(self, messages: tuple[BlockRun, ...], heads: HeadSlice) -> list[Any]:
        """Each message's bytes: its src blocks, or a packed copy of their slice of heads."""
        if heads.is_whole(self.pool.shape[4]):
            return [_buffer(self.bytes[m.src_start : m.src_start + m.count]) for m in messages]
        return [_buffer(pack(self.pool, m.src_start, m.count, heads).view(torch.uint8)) for m in messages]

    async def _start(self, peer: _Peer, batch: Batch, deadline: float, name: str, nbytes: int) -> None:
        """The first message; on a peer nothing reached yet, it must be delivered within
        `connect_s` (plus its bytes at `floor_bytes_per_s`): a path that cannot carry anything
        fails in seconds, not at the piece's deadline."""
        if peer.proven:
            return await self._finish(peer, batch, deadline, name)
        start_by = time.monotonic() + self._config.connect_s + nbytes / self._config.floor_bytes_per_s
        if start_by < deadline and not await peer.worker.wait(batch, start_by - time.monotonic()):
            peer.worker.abandon(batch, TransferTimeout(f"{name}: peer unreachable"))
            await self._drop_peer(peer)
            self._tell(peer.label, peer.path, reached=False)
            raise TransferUnreachable(f"{name}: nothing delivered to peer {peer.label} over {peer.path} within "
                                      f"{self._config.connect_s:g} s; it cannot be reached that way")
        await self._finish(peer, batch, deadline, name)
        peer.proven = True

    async def _finish(self, peer: _Peer, batch: Batch, deadline: float, name: str) -> None:
        if not await peer.worker.wait(batch, deadline - time.monotonic()):
            peer.worker.abandon(batch, TransferTimeout(f"{name} timed out"))
            raise TransferTimeout(f"{name}: not delivered by the deadline (peer gone or piece not expected)")
        error = batch.future.exception()
        if isinstance(error, TransferError):
            raise error
        if error is not None:
            await self._drop_peer(peer)
            raise TransferError(f"{name} failed: {error}") from error

    async def _drop_peer(self, peer: _Peer) -> None:
        """Forget the peer and close its worker (a later send connects anew)."""
        for address, known in list(self._peers.items()):
            if known is peer:
                del self._peers[address]
                peer.worker.fail_all(TransferError(f"connection to peer {peer.label} dropped"))
                await peer.worker.close_endpoint(peer.endpoint, self._config.close_s)
                await peer.worker.close(self._config.drain_s)

    async def close(self) -> None:
        self._closed = True
        for peer in list(self._peers.values()):
            await self._drop_peer(peer)


class UcxTransport(KVTransport):
    def __init__(self, config: UcxConfig = UcxConfig()):
        self.config = config

    def receiver(self, pool: torch.Tensor) -> UcxReceiver:
        return UcxReceiver(pool, self.config)

    def sender(self, pool: torch.Tensor) -> UcxSender:
        return UcxSender(pool, self.config)
