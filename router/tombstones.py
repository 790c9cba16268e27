"""What an Abort finds, when the request it names is not running: an id that ended a moment ago,
or one the router has not seen yet (the Abort overtook its Generate on another connection).

    Abort(id) ──▶ running, of the caller's tenant        cancel it              ABORTED
                  ended within ttl_s                     nothing to do          ENDED
                  unknown                                a tombstone (tenant, id)  PENDING
    Generate(id) arriving while its tombstone lives      ends at once with ABORT, nothing runs

Both memories are per tenant, bounded in time (`ttl_s`) and in size (`max_per_tenant`, the
oldest forgotten first), so neither grows with traffic; a tenant never sees nor affects another's
ids. A tombstone outliving its Generate (one that never comes) only refuses that id to its
tenant until it expires.
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


class AbortOutcome(enum.Enum):
    ABORTED = "aborted"  # it was running: now being aborted (AbortResponse.found)
    PENDING = "pending"  # not seen yet: a Generate of that id arriving within ttl_s ends at once
    ENDED = "ended"  # it had ended already (or was ending): nothing to abort


@dataclass(frozen=True)
class TombstoneConfig:
    ttl_s: float = 30.0
    max_per_tenant: int = 4096


class RecentIds:
    """Request ids per tenant, each remembered for `ttl_s` at most, at most `max_per_tenant` of
    one tenant (the oldest forgotten first)."""

    def __init__(self, config: TombstoneConfig = TombstoneConfig(), clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock
        self._ids: dict[str, OrderedDict[str, float]] = {}

    def add(self, tenant: str, request_id: str) -> None:
        ids = self._fresh(tenant)
        ids.pop(request_id, None)
        ids[request_id] = self.clock()
        while len(ids) > self.config.max_per_tenant:
            ids.popitem(last=False)

    def has(self, tenant: str, request_id: str) -> bool:
        return request_id in self._fresh(tenant)

    def take(self, tenant: str, request_id: str) -> bool:
        """Whether `request_id` was remembered for `tenant`; forgotten now."""
        return self._fresh(tenant).pop(request_id, None) is not None

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._ids.values())

    def _fresh(self, tenant: str) -> OrderedDict[str, float]:
        """The tenant's ids, those older than ttl_s forgotten (they are in age order)."""
        ids = self._ids.setdefault(tenant, OrderedDict())
        oldest = self.clock() - self.config.ttl_s
        while ids and next(iter(ids.values())) < oldest:
            ids.popitem(last=False)
        return ids  # (one per tenant of the tenants file, at most)
