"""RESERVING and MOVING_KV: an attempt's reservation on its decode worker, the first event of its
decode call (router/flow/flow.py opens it), and the KV of a departed request moved into it.

    RESERVING     the decode worker reserves KV blocks for the request, or keeps it queued for
                  them: queued longer than move_after_s while a decode worker has room now, the
                  request moves there (Moved ends the attempt, which closes the call: out of that queue)
    MOVING_KV     the decode worker it departed from (router/flow/departing.py) sends its KV into
                  the reservation; decoding goes on here

A remote prefill fills the reservation instead (router/flow/prefilling.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from router.fleet.clients import FaultKind, Reservation, WorkerFault
from router.flow.departing import Departer
from router.flow.flow_types import Attempt, FlowConfig, FlowEvent, FlowState, Milestone
from router.flow.protocol import Signal
from router.placement.observed import Observed
from router.placement.placing import Placer


class Moved(Exception):
    """The request leaves its decode worker's queue for `target`, which has room now."""

    def __init__(self, target: str, waited_s: float):
        super().__init__(f"moved to {target} after {waited_s:.1f} s queued")
        self.target, self.waited_s = target, waited_s


async def first_event(read: Callable[[], Awaitable[object]], state: FlowState, config: FlowConfig, opened: float,
                      move: Callable[[float], Exception | None]) -> object:
    """A call's first event, `read()`. Every move_check_s without one, once the request has waited
    there longer than move_after_s (`opened`: when the call was) and may move again, `move(waited)`
    names where it goes instead, as the exception to raise."""
    while True:
        try:  # asyncio.timeout, not wait_for: wait_for can swallow a cancel (an Abort) that meets its result
            async with asyncio.timeout(config.move_check_s):
                return await read()
        except TimeoutError:
            waited = time.monotonic() - opened
            if waited < config.move_after_s or state.protocol.moves >= config.max_moves:
                continue
            moved = move(waited)
            if moved is not None:
                raise moved from None


class Reserver:
    def __init__(self, config: FlowConfig, placer: Placer, observed: Observed, departer: Departer):
        self.config = config
        self.placer = placer
        self.observed = observed
        self.departer = departer

    async def reserved(self, attempt: Attempt) -> Reservation:
        """The decode worker's reservation, its first event; while it keeps the request queued for
        blocks, a decode worker with room now takes the request instead: raises Moved."""
        decode = attempt.decode
        reservation = await first_event(attempt.call.next, attempt.state, self.config, attempt.opened,
                                        lambda waited: self._roomier(attempt, waited))
        if not isinstance(reservation, Reservation):
            raise WorkerFault(FaultKind.FAILED, decode.address, f"{decode.address} did not reserve KV blocks "
                                                                f"(sent {type(reservation).__name__} first)")
        self.observed.reserved(decode.address, time.monotonic() - attempt.opened, reservation.block_size)
        return reservation

    def _roomier(self, attempt: Attempt, waited: float) -> Moved | None:
        decode = attempt.decode
        target = self.placer.roomier_decode(attempt.job, attempt.state, decode,
                                            self.observed.block_size(decode.address))
        return None if target is None else Moved(target.address, waited)

    async def move_kv(self, attempt: Attempt, departed: tuple[str, str]) -> AsyncIterator[FlowEvent]:
        """The decode worker the request departed from sends its KV into this one's reservation
        (router/flow/departing.py); a failure resumes the request through the prefill pool."""
        reservation = await self.reserved(attempt)
        state = attempt.state
        state.decode_cached_tokens = reservation.cached_blocks * reservation.block_size
        state.protocol.advance(Signal.MOVE_KV, departed[0])
        moved = await self.departer.move_kv(attempt, departed, reservation)
        state.protocol.advance(Signal.KV_MOVED)
        state.kv_bytes += moved.kv_bytes
        yield Milestone("kv_move", {"pdserve.from": departed[0], "bytes": moved.kv_bytes, "blocks": moved.kv_blocks,
                                    "seconds": moved.kv_seconds})
