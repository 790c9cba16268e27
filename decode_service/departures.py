"""Requests leaving a decode worker with their KV, for another decode worker (a move).

    router --Depart(id, keep)--> keep()     after the engine let it go between two steps (Engine.detach:
                                            a hold on the request's KV; the request ends there)
    router --MoveKV(id, the new decode worker's reservation)--> move()
        decode'.PushKV + the held blocks sent, then decode'.CompleteKV(the last token generated)

Each departure's hold is a lease (LeaseKind.HOLD) owned by its move: MoveKV takes it once, and it
ends when the move does, however it ends; a router that never comes (it died, or chose to
prefill the request again) is bounded by `keep_s`: then the blocks come back. The hold covers the
prompt and every generated token but the last; the new worker feeds that one first, as it would
the first token of a prefill.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.outputs import Detached
from pdserve.errors import InvalidRequestError
from pdserve.parallel.kv_ranks import RanksSender
from pdserve.worker.kv_out import DecodePeer, Piece, Target, check_target, send_piece
from pdserve.worker.kv_sums import KVSums
from pdserve.worker.leases import Lease, LeaseKind, Leases

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Moved:
    """One move's cost: bytes and blocks sent, seconds from the announcement to CompleteKV."""

    kv_bytes: int
    kv_blocks: int
    kv_seconds: float


@dataclass(eq=False)
class _Departure:
    detached: Detached
    lease: Lease
    keep_s: float


class Departures:
    def __init__(self, engine: AsyncEngine, sender: RanksSender | None, peer: DecodePeer | None, block_size: int,
                 block_nbytes: int, leases: Leases, sums: KVSums | None = None):
        """`sender` and `peer`: None on a worker that sends no KV (its requests cannot move; they
        are prefilled again elsewhere). `sums`: how it sums what it sends (None: no checksums)."""
        self.engine = engine
        self.sender = sender
        self.peer = peer
        self.block_size = block_size
        self.block_nbytes = block_nbytes
        self.leases = leases
        self.sums = sums
        self._waiting: dict[str, _Departure] = {}  # request id -> its KV, until MoveKV takes it

    @property
    def can_move(self) -> bool:
        return self.sender is not None and self.peer is not None

    def keep(self, request_id: str, detached: Detached, keep_s: float | None) -> bool:
        """A request the engine let go (Engine.detach): its KV held for a move for at most
        `keep_s`, or given back at once (None, or a worker that cannot send). Whether it is kept."""
        if keep_s is None or not self.can_move:
            self.engine.release_nowait(detached.hold)
            return False
        self.forget(request_id)  # an earlier departure under this id (never moved) ends now
        departure: _Departure | None = None

        def reclaim(_reason) -> None:
            self.engine.release_nowait(detached.hold)
            if departure is not None and self._waiting.get(request_id) is departure:
                del self._waiting[request_id]

        lease = self.leases.grant(LeaseKind.HOLD, f"move of {request_id}", len(detached.hold.blocks), keep_s, reclaim)
        departure = self._waiting[request_id] = _Departure(detached, lease, keep_s)
        return True

    def forget(self, request_id: str) -> None:
        """Give back a departure's KV now (its request will not move after all)."""
        departure = self._waiting.pop(request_id, None)
        if departure is not None:
            departure.lease.end()

    async def move(self, request_id: str, target: Target) -> Moved:
        """Send a departed request's KV into `target` (blocks from its cached ones on), then
        complete it with the request's last token. InvalidRequestError, with the KV given back,
        for an unknown or already moved request or a reservation that does not fit the KV;
        PeerFault when the new worker or the send fails."""
        departure = self._waiting.pop(request_id, None)
        if departure is None:
            raise InvalidRequestError(f"no request {request_id!r} departed from here with its KV (it never did, "
                                      "it moved already, or its KV was given back)")
        assert self.sender is not None and self.peer is not None
        detached, lease = departure.detached, departure.lease
        try:
            check_target(target, self.sender, self.block_size, self.block_nbytes, detached.kv_tokens,
                         self.engine.engine.kv.groups.count)
            lease.renew(2 * departure.keep_s)  # the send's own deadlines end it first
            cached, blocks = target.cached_blocks * self.engine.engine.kv.groups.count, detached.hold.blocks
            started = time.perf_counter()
            piece = Piece(target.transfer_id, 0, cached, blocks[cached:], departure.keep_s, target.secret,
                          len(self.sender.ports))
            sent = await send_piece(self.sender, self.peer, target, piece, self.sums)
            await self.peer.complete_kv(target.decode_endpoint, target.transfer_id, 1, detached.output_token_ids[-1],
                                        target.secret, (sent.checksum,) if self.sums is not None else ())
            seconds = time.perf_counter() - started
        finally:
            lease.end()
        log.info("request %s moved to %s: %d blocks, %d bytes in %.3f s", request_id, target.decode_endpoint,
                 len(blocks) - cached, sent.nbytes, seconds)
        return Moved(sent.nbytes, len(blocks) - cached, seconds)

    def waiting(self, request_id: str) -> bool:
        """Whether the request's KV waits here for its move."""
        return request_id in self._waiting

    def __len__(self) -> int:
        """Departed requests whose KV waits here for its move (a drain waits for them too)."""
        return len(self._waiting)
