"""Scheduler statistics to the WorkerStats message."""

from __future__ import annotations

from pdserve.v1 import worker_pb2 as wpb


def stats_to_pb(role: str, stats, draining: bool, rates=None, queued_prefill_tokens: int = 0) -> wpb.WorkerStats:
    """`rates`: the engine's StepRates (pdserve/engine/step_meter.py), or None (zeros)."""
    kv = stats.kv
    return wpb.WorkerStats(
        role=role, blocks_total=kv.total, blocks_free=kv.free, blocks_active=kv.active,
        blocks_cached=kv.cached, blocks_swapped=kv.swapped, requests_running=stats.running,
        requests_waiting=stats.waiting, draining=draining, blocks_held=kv.held,
        blocks_reserved=stats.blocks_reserved, blocks_quarantined=kv.quarantined,
        queued_prefill_tokens=queued_prefill_tokens,
        prefill_tokens_per_s=rates.prefill_tokens_per_s if rates is not None else 0.0,
        step_seconds=rates.step_s if rates is not None else 0.0)
