"""KV arriving for one reserved request on a decode worker, and what a withdrawal leaves unsafe."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from pdserve.transfer import CancelResult, TransferError, settled_all
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
    Decode stream; its limit is the KV deadline between pieces (armed by the first piece)."""

    transfer_id: str
    request_id: str
    block_ids: tuple[int, ...]
    kv_timeout_s: float
    lease: Lease
    pieces: dict[int, asyncio.Task] = field(default_factory=dict)

    def failures(self) -> list[TransferError]:
        """Pieces that ended with a transfer error (their own deadline, a bad layout)."""
        done = [t for t in self.pieces.values() if t.done() and not t.cancelled()]
        return [e for e in (t.exception() for t in done) if isinstance(e, TransferError)]

    def first_failure(self) -> BaseException | None:
        """Once every piece is done: the first one's error, if any failed."""
        return next((t.exception() for t in self.pieces.values() if not t.cancelled() and t.exception()), None)
