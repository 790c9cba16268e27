"""Which workers serve a request. Policies only: they read worker snapshots and never call out.

`avoid` holds the workers this request already failed on: they are chosen only when no other
worker of the role is usable (with a single worker, a retry goes back to it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from router.workers import Worker


class NoWorker(RuntimeError):
    pass


def _candidates(workers: list[Worker], avoid: Collection[str], role: str) -> list[Worker]:
    if not workers:
        raise NoWorker(f"no {role} worker is ready")
    preferred = [w for w in workers if w.address not in avoid]
    return preferred or workers


def choose_decode(workers: list[Worker], avoid: Collection[str] = ()) -> Worker:
    """Fewest requests in flight from this router, then most free KV blocks, then fewest running."""
    return max(_candidates(workers, avoid, "decode"), key=lambda w: (-w.assigned, w.free_blocks, -w.running))


def choose_prefill(workers: list[Worker], cached: Mapping[str, int], avoid: Collection[str] = ()) -> Worker:
    """Longest cached prefix first, then the least loaded."""
    return max(_candidates(workers, avoid, "prefill"),
               key=lambda w: (cached.get(w.address, 0), -w.assigned, -(w.running + w.waiting)))
