"""Which workers serve a request. Policies only: they read worker snapshots and never call out.

`avoid` holds the workers this request already left: they are chosen only when no other worker
of the role is usable (with a single worker, a retry goes back to it). Of those, the ones it
failed on (`failed`, a subset) come last: one it merely departed from (rebalancing) goes first,
so a request whose second worker dies is not placed on the dead one again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from router.fleet.workers import Worker


class NoWorker(RuntimeError):
    pass


def _candidates(workers: list[Worker], avoid: Collection[str], role: str,
                failed: Collection[str] = ()) -> list[Worker]:
    if not workers:
        raise NoWorker(f"no {role} worker is ready")
    preferred = [w for w in workers if w.address not in avoid]
    return preferred or [w for w in workers if w.address not in failed] or workers


DECODE_SLACK = 4  # requests in flight a decode worker may have beyond the least loaded one, for its cache


def choose_decode(workers: list[Worker], cached: Mapping[str, int] | None = None, avoid: Collection[str] = (),
                  slack: int = DECODE_SLACK, failed: Collection[str] = ()) -> Worker:
    """The longest cached prefix of the prompt (an earlier turn of the conversation decoded
    there) among the workers within `slack` requests in flight of the least loaded; then fewest
    in flight, most free KV blocks, fewest running. So a conversation stays where its KV is,
    and no worker is flooded for its cache."""
    candidates = _candidates(workers, avoid, "decode", failed)
    least = min(_in_flight(w) for w in candidates)
    near = [w for w in candidates if _in_flight(w) <= least + slack]
    cached = cached or {}
    return max(near, key=lambda w: (cached.get(w.address, 0), -_in_flight(w), w.free_blocks, -w.running))


def _in_flight(worker: Worker) -> int:
    """Requests on it, and those that chose it and are still on their way (their prefill, their
    admission): requests that arrive together see each other's choices."""
    return worker.assigned + worker.claimed


def choose_prefill(workers: list[Worker], cached: Mapping[str, int], avoid: Collection[str] = (),
                   predicted_s: Mapping[str, float] | None = None) -> Worker:
    """The earliest predicted first token (`predicted_s`, router/placement/predicting.py: the queue ahead and
    the part of the prompt not cached there, at the worker's speed); then the longest cached
    prefix, then the least loaded."""
    predicted_s = predicted_s or {}
    return min(_candidates(workers, avoid, "prefill"),
               key=lambda w: (predicted_s.get(w.address, 0.0), -cached.get(w.address, 0), w.assigned,
                              w.running + w.waiting))
