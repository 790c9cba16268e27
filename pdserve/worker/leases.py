"""Leases on what a worker holds for another process: who owns it, until when, how it comes back.

    grant(kind, owner, blocks, limit_s, reclaim) ──> Lease ──end(ENDED)────> reclaim(ENDED)
                                                       │  └──settle()─────> reclaim(SETTLED)
                                                       └── limit passes ──> reclaim(EXPIRED)

A lease ends exactly once; `reclaim(reason)` gives the resource back (or makes its owner give
it back). `renew` moves the limit (a reservation's KV deadline between pieces). Every end is
counted by kind and reason, and logged when the limit took it (but for a kind whose limit is its
usual end: a finished request's result kept for a re-attach). Runs on the event loop.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


class LeaseKind(enum.Enum):
    HOLD = "hold"  # blocks a KV send reads (a prefill piece, a departed request's move); owner: that send
    WAITING = "waiting"  # prefill: a started prompt's KV waiting for its reservation; owner: the router's Prefill stream
    RESERVATION = "reservation"  # decode: blocks a prefill worker writes; owner: the router's Decode stream
    QUARANTINE = "quarantine"  # decode: blocks a withdrawn receive may still write; owner: the transport
    ORPHAN = "orphan"  # decode: a request whose router's stream broke, kept for a re-attach; owner: none (the grace)
    RESULT = "result"  # decode: a finished request's tokens and end (no block), kept for a re-attach; owner: none


ROUTINE_EXPIRY = frozenset({LeaseKind.RESULT})  # kinds whose limit is their usual end: not logged


class Reclaim(enum.Enum):
    ENDED = "ended"  # the owner ended and gave it back
    SETTLED = "settled"  # the transport said nothing can still touch the blocks
    EXPIRED = "expired"  # its time limit passed first


ReclaimFn = Callable[["Reclaim"], None]


@dataclass(eq=False)
class Lease:
    kind: LeaseKind
    owner: str
    blocks: int
    _reclaim: ReclaimFn = field(repr=False)
    _table: "Leases" = field(repr=False)
    deadline: float | None = None  # monotonic seconds; None: the owner's end is the only limit
    _timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    ended: Reclaim | None = None

    def renew(self, limit_s: float) -> None:
        """The limit is now limit_s from now."""
        if self.ended is not None:
            return
        self._cancel_timer()
        self.deadline = time.monotonic() + limit_s
        self._timer = asyncio.get_running_loop().call_later(limit_s, self.end, Reclaim.EXPIRED)

    def end(self, reason: Reclaim = Reclaim.ENDED) -> bool:
        """Reclaim now; True the first time (later calls do nothing)."""
        if self.ended is not None:
            return False
        self.ended = reason
        self._cancel_timer()
        self._table._ended(self)
        self._reclaim(reason)
        return True

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


EndListener = Callable[[LeaseKind, Reclaim], None]


class Leases:
    """The leases one worker has granted, live ones by kind and ends counted by kind and reason."""

    def __init__(self) -> None:
        self._live: dict[LeaseKind, set[Lease]] = {kind: set() for kind in LeaseKind}
        self.ends: Counter[tuple[LeaseKind, Reclaim]] = Counter()
        self._listeners: list[EndListener] = []

    def listen(self, listener: EndListener) -> None:
        """`listener(kind, reason)` runs after every lease end (metrics)."""
        self._listeners.append(listener)

    def grant(self, kind: LeaseKind, owner: str, blocks: int, limit_s: float | None,
              reclaim: ReclaimFn) -> Lease:
        lease = Lease(kind, owner, blocks, reclaim, self)
        self._live[kind].add(lease)
        if limit_s is not None:
            lease.renew(limit_s)
        return lease

    def live(self, kind: LeaseKind) -> int:
        return len(self._live[kind])

    def blocks(self, kind: LeaseKind) -> int:
        return sum(lease.blocks for lease in self._live[kind])

    def _ended(self, lease: Lease) -> None:
        self._live[lease.kind].discard(lease)
        self.ends[lease.kind, lease.ended] += 1
        if lease.ended is Reclaim.EXPIRED and lease.kind not in ROUTINE_EXPIRY:
            log.warning("%s lease of %s (%d blocks) expired: reclaimed", lease.kind.value, lease.owner, lease.blocks)
        for listener in self._listeners:
            listener(lease.kind, lease.ended)
