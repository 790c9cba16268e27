"""An Abort that reaches a router not running its request: another router may run it, or run it
soon (the Abort overtook its Generate). No router knows another's requests; every worker knows the
owner (tenant, client id: pdserve/aborts.py) of each attempt it holds, so the workers are asked
(pdserve/worker/client_aborts.py):

    Abort(id) of tenant T, not running here
      every worker: end T's requests of that id (LIVE)      one held it         ABORTED
      ended here within ttl_s                                nothing to do       ENDED
      every worker: end them, or keep a tombstone (REMEMBER) one held it         ABORTED (tombstones forgotten)
                                                             none                PENDING
      no worker answered: this router keeps the tombstone (router/doors/tombstones.py)

    a request refused or ended by a worker's abort (ABORTED): its router has every worker forget
    the owner's tombstones (FORGET), then ends it with finish ABORT: the id serves again

Each call is bounded by `timeout_s`: as long as a channel's keepalive takes to call a silent
worker gone (pdserve/rpc/channels.py), since a worker too loaded to answer within a second is not
dead, and one that did not answer may still apply the Abort late (the first call ending the request,
the second then finding none: PENDING for a request that was aborted). A worker that does not
answer holds nothing of a live request (its requests fail over) and keeps no tombstone. A worker
that restarts forgets its tombstones: an Abort overtaking its Generate is then missed (the Generate
runs).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pdserve.aborts import AbortScope, Owner, RecentIds
from router.doors.tombstones import AbortOutcome
from router.fleet.clients import WorkerClients
from router.fleet.workers import WorkerPool

ABORT_TIMEOUT_S = 4.0  # each worker's answer to an Abort by owner: keepalive time + timeout


@dataclass(frozen=True)
class Reach:
    held: bool  # a worker held a request of the owner (now aborted)
    answered: int  # workers that answered


class FleetAborts:
    def __init__(self, pool: WorkerPool, clients: WorkerClients, timeout_s: float = ABORT_TIMEOUT_S):
        self.pool = pool
        self.clients = clients
        self.timeout_s = timeout_s

    async def send(self, owner: Owner, scope: AbortScope) -> Reach:
        """To every worker of the pool (usable or not), concurrently."""
        workers = list(self.pool.workers.values())
        answers = await asyncio.gather(*(self.clients.abort(w.address, w.role, owner, scope, self.timeout_s)
                                         for w in workers))
        return Reach(any(answers), sum(a is not None for a in answers))


async def abort_elsewhere(fleet: FleetAborts, owner: Owner, ended: RecentIds, tombstones: RecentIds) -> AbortOutcome:
    """The table above, for a request not running at this router; `ended` and `tombstones` are
    this router's memories of the ids that ended here and of the Aborts it keeps itself."""
    if (await fleet.send(owner, AbortScope.LIVE)).held:
        return AbortOutcome.ABORTED
    if ended.has(owner.tenant, owner.request_id):
        return AbortOutcome.ENDED
    reach = await fleet.send(owner, AbortScope.REMEMBER)
    if reach.held:  # placed meanwhile: the other workers' tombstones are not needed
        await fleet.send(owner, AbortScope.FORGET)
        return AbortOutcome.ABORTED
    if not reach.answered:
        tombstones.add(owner.tenant, owner.request_id)
    return AbortOutcome.PENDING
