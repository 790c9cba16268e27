"""Measures this device's prefill speed and host-link bandwidth, for the recompute-or-swap cost
model (recompute time = tokens / prefill speed; swap time = bytes / link): once per machine,
model, layout and thread count, kept beside the kernels (pdserve/measurements.py), so a worker
that starts again reads them instead of running two forward passes before it serves.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from pdserve.attention.base import AttentionBackend
from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.config import PreemptionConfig
from pdserve.kv.kv_cache import KVCache
from pdserve.measurements import measured


def measure_prefill_tokens_per_s(model, kv: KVCache, attn: AttentionBackend, tokens: int = 128) -> float:
    """One forward pass of `tokens` tokens into the first blocks of the pool (still all free)."""
    batch = prefill_batch(tokens, 0, kv)
    device = kv.data.device
    with torch.inference_mode():
        model.forward(batch, kv, attn)
        _sync(device)
        started = time.perf_counter()
        model.forward(batch, kv, attn)
        _sync(device)
    return tokens / max(time.perf_counter() - started, 1e-9)


def prefill_batch(tokens: int, start: int, kv: KVCache) -> ForwardBatch:
    """`tokens` prompt tokens at positions [start, start + tokens) of one sequence in the pool's
    first blocks, its last token's logits wanted."""
    end, device = start + tokens, kv.data.device
    blocks = tuple(range(-(-end // kv.block_size)))
    return ForwardBatch(
        input_ids=torch.zeros(tokens, dtype=torch.long, device=device),
        positions=torch.arange(start, end, device=device),
        slot_mapping=torch.arange(start, end, device=device),
        seqs=(SeqSpan(0, tokens, end, blocks),),
        logits_indices=torch.tensor([tokens - 1], device=device),
    )


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


def calibrated(cfg: PreemptionConfig, model, kv: KVCache, host: KVCache, attn: AttentionBackend,
               depends_on: dict[str, Any]) -> PreemptionConfig:
    """`cfg` with this machine's figures, measured now unless kept under `depends_on` (what
    identifies the model, its layout and the threads: `serving_identity`)."""
    def measure() -> dict[str, float]:
        return {"prefill_tokens_per_s": measure_prefill_tokens_per_s(model, kv, attn),
                "host_link_bytes_per_s": measure_host_link_bytes_per_s(kv, host)}

    pool = {"block_bytes": kv.block_nbytes, "device": str(kv.data.device), "backend": type(attn).__name__}
    return dataclasses.replace(cfg, **measured("calibration", {**depends_on, **pool}, measure))


def serving_identity(source: Path, model, dtype: torch.dtype) -> dict[str, Any]:
    """What a figure measured on `model` (loaded from `source`) depends on besides the machine: the
    checkpoint's file, its layout and the threads torch computes on."""
    stat = source.stat()
    head = getattr(model, "lm_head", None)  # a tensor-parallel leader's model has its own
    return {"model": str(source.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "dtype": str(dtype),
            "threads": torch.get_num_threads(), "model_type": type(model).__name__,
            "packed": type(getattr(head, "packed", None)).__name__,
            "streamed": getattr(getattr(getattr(head, "streamed", None), "kernel", None), "library_name", None),
            "route": str(getattr(head, "route", None)), "fused": getattr(model, "fused_decode", None) is not None}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
