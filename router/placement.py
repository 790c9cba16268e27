"""Which workers serve a request. Policies only: they read worker snapshots and never call out."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from router.workers import Worker


class NoWorker(RuntimeError):
    pass


def choose_decode(workers: list[Worker], exclude: Collection[str] = ()) -> Worker:
    """Fewest requests in flight from this router, then most free KV blocks, then fewest running."""
    candidates = [w for w in workers if w.address not in exclude]
    if not candidates:
        raise NoWorker("no decode worker is ready")
    return max(candidates, key=lambda w: (-w.assigned, w.free_blocks, -w.running))


def choose_prefill(workers: list[Worker], cached: Mapping[str, int], exclude: Collection[str] = ()) -> Worker:
    """Longest cached prefix first, then the least loaded."""
    candidates = [w for w in workers if w.address not in exclude]
    if not candidates:
        raise NoWorker("no prefill worker is ready")
    return max(candidates, key=lambda w: (cached.get(w.address, 0), -w.assigned, -(w.running + w.waiting)))
