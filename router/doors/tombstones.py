"""What an Abort finds, when the request it names is not running at this router: an id that ended
here a moment ago, one another router runs, or one no router has seen yet (the Abort overtook its
Generate on another connection, maybe to another router).

    Abort(id) ──▶ running here, of the caller's tenant   cancel it                  ABORTED
                  running at another router              the workers end it         ABORTED
                  ended here within ttl_s                nothing to do              ENDED
                  unknown                                a tombstone (tenant, id)   PENDING
    Generate(id) arriving while its tombstone lives      ends at once with ABORT, nothing runs

The last two rows across routers are router/doors/aborting.py's: the tombstone is kept by every worker
(pdserve/worker/client_aborts.py), and by this router only when no worker answered. Every
memory is per tenant, bounded in time (`ttl_s`) and in size (`max_per_tenant`, the oldest
forgotten first: pdserve/aborts.py), so none grows with traffic; a tenant never sees nor affects
another's ids. A tombstone outliving its Generate (one that never comes) only refuses that id to
its tenant until it expires.
"""

from __future__ import annotations

import enum

from pdserve.aborts import RecentIds, TombstoneConfig  # the memory itself, shared with the workers

__all__ = ["AbortOutcome", "RecentIds", "TombstoneConfig"]


class AbortOutcome(enum.Enum):
    ABORTED = "aborted"  # it was running: now being aborted (AbortResponse.found)
    PENDING = "pending"  # not seen yet: a Generate of that id arriving within ttl_s ends at once
    ENDED = "ended"  # it had ended already (or was ending): nothing to abort
