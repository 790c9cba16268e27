"""Scheduler statistics to the WorkerStats message."""

from __future__ import annotations

from pdserve.v1 import worker_pb2 as wpb


def stats_to_pb(role: str, stats, draining: bool) -> wpb.WorkerStats:
    kv = stats.kv
    return wpb.WorkerStats(
        role=role, blocks_total=kv.total, blocks_free=kv.free, blocks_active=kv.active,
        blocks_cached=kv.cached, blocks_swapped=kv.swapped, requests_running=stats.running,
        requests_waiting=stats.waiting, draining=draining, blocks_held=kv.held,
        blocks_reserved=stats.blocks_reserved, blocks_quarantined=kv.quarantined)
