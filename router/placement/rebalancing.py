"""When a request decoding on a decode worker under memory pressure departs for a roomier one,
KV and all (policy only; router/flow/departing.py asks the worker to let it go, as for a worker that leaves).

A worker is under pressure when requests wait there for blocks: new ones queued, or running ones
it preempted. A request decoding there departs when another decode worker could reserve it now
(nothing waiting there, free blocks for it: `Placer.roomier_decode`), so its blocks go to a waiting
request and it goes on elsewhere without recomputing anything. At most one request leaves a worker
per `interval_s` (the next poll shows what the first did), and each request at most once, so two
workers never pass requests back and forth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from router.fleet.workers import Worker


@dataclass
class Rebalancer:
    interval_s: float | None = 1.0  # None: requests never depart for this
    _last: dict[str, float] = field(default_factory=dict)  # worker address -> its last departure

    def due(self, worker: Worker, departures: int) -> bool:
        """Whether a request on `worker` that departed `departures` times should look for a roomier one."""
        if self.interval_s is None or departures or worker.waiting <= 0:
            return False
        return time.monotonic() - self._last.get(worker.address, -1e9) >= self.interval_s

    def departed(self, worker: Worker) -> None:
        self._last[worker.address] = time.monotonic()
