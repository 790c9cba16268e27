"""What an Abort names and remembers, on the routers and on the workers alike.

A client's request is its tenant's id (`Owner`): the id the client gave, under the tenant the
router authenticated; the workers hold it under attempt ids of their own, each attempt tagged
with its owner. An Abort that reaches a router not running the request goes to every worker
(router/doors/aborting.py), which ends the owner's requests it holds or, asked to, remembers the owner
for a while (a tombstone) so that a request of it arriving later is refused at once
(pdserve/worker/client_aborts.py).

`RecentIds` is that memory: ids per tenant, each kept for `ttl_s` at most and at most
`max_per_tenant` of one tenant (the oldest forgotten first), so it never grows with traffic.
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple


class Owner(NamedTuple):
    """A client's request: the id it gave, of the tenant it is."""

    tenant: str
    request_id: str


class AbortScope(enum.Enum):
    """What a worker does with an Abort of an owner."""

    LIVE = "live"  # end the owner's requests it holds; remember nothing
    REMEMBER = "remember"  # the same, and with none held a tombstone: a request of it arriving refused
    FORGET = "forget"  # the owner's tombstone is spent (its request ended): forget it


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
