"""Measures this device's prefill speed and host-link bandwidth once at start-up, for the
recompute-or-swap cost model (recompute time = tokens / prefill speed; swap time = bytes / link)."""

from __future__ import annotations

import dataclasses
import time

import torch

from pdserve.attention.base import AttentionBackend
from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.config import PreemptionConfig
from pdserve.kv.kv_cache import KVCache


def measure_prefill_tokens_per_s(model, kv: KVCache, attn: AttentionBackend, tokens: int = 128) -> float:
    """One forward pass of `tokens` tokens into the first blocks of the pool (still all free)."""
    blocks = tuple(range(-(-tokens // kv.block_size)))
    device = kv.data.device
    batch = ForwardBatch(
        input_ids=torch.zeros(tokens, dtype=torch.long, device=device),
        positions=torch.arange(tokens, device=device),
        slot_mapping=torch.arange(tokens, device=device),
        seqs=(SeqSpan(0, tokens, tokens, blocks),),
        logits_indices=torch.tensor([tokens - 1], device=device),
    )
    with torch.inference_mode():
        model.forward(batch, kv, attn)
        _sync(device)
        started = time.perf_counter()
        model.forward(batch, kv, attn)
        _sync(device)
    return tokens / max(time.perf_counter() - started, 1e-9)


def measure_host_link_bytes_per_s(kv: KVCache, host: KVCache) -> float:
    """Copy a few blocks device -> host and back (the swap path)."""
    n = min(8, kv.num_blocks, host.num_blocks)
    if n == 0:
        return 0.0
    pairs = [(i, i) for i in range(n)]
    kv.copy_blocks_to(host, pairs)  # first touch of the host pages
    _sync(kv.data.device)
    started = time.perf_counter()
    kv.copy_blocks_to(host, pairs)
    host.copy_blocks_to(kv, pairs)
    _sync(kv.data.device)
    return 2 * n * kv.block_nbytes / max(time.perf_counter() - started, 1e-9)


def calibrated(cfg: PreemptionConfig, model, kv: KVCache, host: KVCache, attn: AttentionBackend) -> PreemptionConfig:
    return dataclasses.replace(cfg, prefill_tokens_per_s=measure_prefill_tokens_per_s(model, kv, attn),
                               host_link_bytes_per_s=measure_host_link_bytes_per_s(kv, host))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
