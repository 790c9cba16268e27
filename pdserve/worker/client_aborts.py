"""A worker's part in an Abort sent to any router: the client's request is its owner (tenant and
id, pdserve/aborts.py), which every attempt carries; a router not running the request asks every
worker (router/doors/aborting.py).

    Abort(owner, LIVE)        every request of the owner held here ends (its stream: ABORTED)
    Abort(owner, REMEMBER)    the same; none held: a tombstone for the owner (ttl_s, bounded)
    Abort(owner, FORGET)      the owner's tombstone is spent elsewhere: forgotten
    a request arriving        its owner's tombstone taken, and it is refused with ABORTED

One per worker process, over every role's table (an elastic worker has two). The check on arrival
and the request's entry in its table happen in one turn of the event loop (the servicer checks,
then opens, with no await between), so an Abort finds a request either held or not yet arrived.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from pdserve.aborts import AbortScope, Owner, RecentIds, TombstoneConfig
from pdserve.errors import ClientAborted
from pdserve.worker.live import LiveRequests


class ClientAborts:
    def __init__(self, tables: Sequence[LiveRequests], config: TombstoneConfig = TombstoneConfig(),
                 clock: Callable[[], float] = time.monotonic):
        self.tables = tuple(tables)
        self.tombstones = RecentIds(config, clock)

    def apply(self, owner: Owner, scope: AbortScope) -> bool:
        """Whether a request of `owner` was held here (now aborted)."""
        if scope is AbortScope.FORGET:
            self.tombstones.take(owner.tenant, owner.request_id)
            return False
        held = [(table, record) for table in self.tables for record in table.records()
                if record.session.owner == owner]
        for table, record in held:
            table.fail(record, ClientAborted(f"request {owner.request_id} aborted by its client"))
        if not held and scope is AbortScope.REMEMBER:
            self.tombstones.add(owner.tenant, owner.request_id)
        return bool(held)

    def refuse_if_aborted(self, owner: Owner | None) -> None:
        """ClientAborted when the owner's Abort came first (its tombstone is spent then)."""
        if owner is not None and self.tombstones.take(owner.tenant, owner.request_id):
            raise ClientAborted(f"request {owner.request_id} was aborted by its client before it arrived")
