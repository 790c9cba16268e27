"""Scheduler statistics to the WorkerStats message."""

from __future__ import annotations

from pdserve.identity import ModelFingerprint, WorkerIdentity
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


def identity_to_pb(identity: WorkerIdentity) -> wpb.WorkerIdentity:
    m = identity.model
    return wpb.WorkerIdentity(weights=m.weights, architecture=m.architecture, tokenizer=m.tokenizer,
                              kv_dtype=identity.kv_dtype, block_size=identity.block_size, protocol=identity.protocol,
                              tensor_parallel_size=identity.tensor_parallel_size)


def identity_from_pb(message: wpb.WorkerIdentity) -> WorkerIdentity | None:
    """None for a worker that sent none (one older than identities: never paired)."""
    if not message.weights:
        return None
    return WorkerIdentity(ModelFingerprint(message.weights, message.architecture, message.tokenizer),
                          message.kv_dtype, message.block_size, message.protocol, message.tensor_parallel_size or 1)
