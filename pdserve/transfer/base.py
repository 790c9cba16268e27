"""KV block transfer between workers: the data plane's interfaces, results and errors.

    prefill worker (KVSender over its pool)              decode worker (KVReceiver over its pool)
                                                          1. allocates dst blocks
             <------ control plane: receiver.address(), transfer_id, secret, seq, pairs ------
                                                          2. await expect(id, seq, pairs, timeout, secret)
    3. await send(address, id, seq, pairs, timeout, secret)  == data ==>  dst blocks of exactly `pairs`
    4. TransferResult                                     5. TransferResult (all bytes landed)

Mechanism only: which blocks, when to send and what to do on failure is decided by the services.
A transfer's `secret` (16..64 random bytes the decode side drew for its reservation) keys the
piece on both ends: data sent under another secret matches no posted piece and never lands.
Both sides derive the same runs from the same pair list (`descriptors.merge_runs`), so a piece
travels as a few large messages, one per run of consecutive block ids.

Pools are block-major tensors, `KVCache.data`:
    pool: [num_blocks, num_layers, 2, block_size, kv_heads, head_dim], contiguous; block b is the
    byte range [b * block_nbytes, (b + 1) * block_nbytes).

All methods are called from the asyncio loop (asyncio or uvloop) that built the object; none of
them blocks that loop for long.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from pdserve.transfer.descriptors import BlockRun
from pdserve.transfer.head_slices import HeadSlice

Pairs = Sequence[tuple[int, int]]


@dataclass(frozen=True)
class TransferResult:
    """One completed piece. On the receiver: every byte of every run is in the pool.

    seconds: on the sender, from `send` to delivery; on the receiver, from `expect` to the last
    byte (so it includes waiting for the sender).
    """

    transfer_id: str
    seq: int
    nbytes: int
    runs: tuple[BlockRun, ...]
    seconds: float

    @property
    def gbps(self) -> float:
        return self.nbytes / max(self.seconds, 1e-12) / 1e9


@dataclass(frozen=True)
class CancelResult:
    """What `KVReceiver.cancel` withdrew.

    NOTE: blocks in `unsafe_blocks` may still be written by a message that was already being
    delivered when the deadline to drain it passed; they must not be reused until `settled`
    resolves (every such receive has completed or been cancelled), or, where `settled` is None
    (the transport cannot tell), until the caller's own bound. Empty in normal operation: then
    every block of the transfer can be freed at once.
    """

    transfer_id: str
    pieces: int
    unsafe_blocks: tuple[int, ...] = ()
    settled: asyncio.Future | None = None


def settled_all(futures: Sequence[asyncio.Future | None]) -> asyncio.Future | None:
    """One `settled` future for several: resolves when all have; None if any is None or none given."""
    if not futures or any(f is None for f in futures):
        return None
    return asyncio.gather(*futures, return_exceptions=True)


class TransferError(Exception):
    """A piece failed; on the receiver nothing more is written into its blocks, except into
    `unsafe_blocks` until `settled` resolves (as in CancelResult)."""

    def __init__(self, message: str, unsafe_blocks: tuple[int, ...] = (),
                 settled: asyncio.Future | None = None):
        super().__init__(message)
        self.unsafe_blocks = unsafe_blocks
        self.settled = settled


class TransferTimeout(TransferError):
    """The deadline passed before the piece completed; what was posted has been withdrawn."""


class TransferCancelled(TransferError):
    """`cancel(transfer_id)` withdrew the piece while it was awaited."""


class TransferUnreachable(TransferError):
    """Nothing could be delivered to the peer on the path chosen for it within the sender's
    connect time: the peer is unreachable that way (the sender dropped its connection)."""


class TransferRejected(TransferError):
    """The receiver refused to set up a piece (bad blocks, overlap with a live piece, reused id)."""


class KVReceiver(ABC):
    """Decode side: accepts data only into the blocks of pieces it set up with `expect`.

    Anything sent for a (transfer_id, seq) it did not post, or under another secret, is never
    written into the pool, and a piece completes only when the sender's layout (runs and block
    size) equals the expected one.
    """

    @abstractmethod
    def address(self) -> bytes:
        """Opaque bytes a sender needs to reach this receiver (carried by the control plane)."""

    @abstractmethod
    async def expect(self, transfer_id: str, seq: int, pairs: Pairs, timeout_s: float, *,
                     secret: bytes, heads: HeadSlice | None = None) -> TransferResult:
        """Post receives into exactly the dst blocks of `pairs`, for a sender holding `secret`
        only, and wait until all data arrived. `heads`: the piece carries only these of the
        pool's heads (None: whole blocks); pieces of disjoint slices may share blocks.

        Raises TransferTimeout at the deadline and TransferCancelled on `cancel`, after
        withdrawing everything it posted; TransferError when the sender's layout differs;
        TransferRejected before posting anything when the piece cannot be set up (a bad secret too).
        """

    @abstractmethod
    def cancel(self, transfer_id: str) -> CancelResult:
        """Withdraw every piece posted for `transfer_id`; its blocks may then be freed and reused
        (all but the result's unsafe_blocks).

        The id is retired: a later `expect` with it is rejected (leftover messages of the
        withdrawn pieces could otherwise match). A retry needs a fresh transfer_id.
        """

    @abstractmethod
    async def close(self) -> None:
        """Withdraw everything and release the transport; awaited pieces raise TransferCancelled."""


PeerListener = Callable[[str, str, str, bool], None]


class KVSender(ABC):
    """Prefill side: writes blocks of its own pool into a receiver's blocks."""

    @abstractmethod
    async def send(
        self, peer_address: bytes, transfer_id: str, seq: int, pairs: Pairs, timeout_s: float, *, secret: bytes,
        heads: HeadSlice | None = None
    ) -> TransferResult:
        """Send src blocks of `pairs` into the peer's dst blocks; returns once the peer has them.
        `secret` is the one the receiver expects the piece under (ValueError when malformed).
        `heads`: only these of this pool's heads (None: whole blocks); the receiver's slice must
        be as wide, else the layouts differ.

        Success means delivered: a receiver whose expected layout differs refuses the piece on
        its side (its `expect` raises), which a one-way transport may not report back here.

        The connection to a peer is made once and reused. Raises TransferTimeout at the deadline
        (peer gone, or the piece was never expected, or not under this secret) and TransferError
        when the peer fails.
        """

    @abstractmethod
    async def close(self) -> None:
        """Drop every connection; pending sends raise TransferError."""

    def on_peer(self, listener: "PeerListener") -> None:
        """`listener(peer, path, transports, reached)` for each connection opened to a peer, or
        found impossible; a transport with one way to every peer never calls it."""


class KVTransport(ABC):
    """Builds the two ends of one transport kind over pools (`KVCache.data`)."""

    @abstractmethod
    def receiver(self, pool: torch.Tensor) -> KVReceiver:
        """Must be called with the asyncio loop running; the receiver serves that loop."""

    @abstractmethod
    def sender(self, pool: torch.Tensor) -> KVSender:
        """Must be called with the asyncio loop running; the sender serves that loop."""


def pool_bytes(pool: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_nbytes] uint8 view of a contiguous block-major pool (shares memory)."""
    if not pool.is_contiguous():
        raise ValueError("the KV pool must be contiguous")
    return pool.view(pool.shape[0], -1).view(torch.uint8)
