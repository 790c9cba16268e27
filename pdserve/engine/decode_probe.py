"""How many rows a decode step runs fused on this machine: the one C call through every layer
(pdserve/cpu/fused_decode.py) against the layers one by one on the layout the product probe
chose (pdserve/cpu/weight_layout.py), each timed on the engine's own model, pool and attention
backend at PROBE_BATCHES decode rows, cached per machine and model (pdserve/measurements.py).

    rows = fused_rows(timings)   # the largest probed batch up to which fused won at every probe

The probe stops at the first batch where the layers one by one were faster: no larger batch
could change the rows (the larger ones are the slowest to time, seconds on a first start).

The fused step runs the panels' product, whose speed against a GEMM library's depends on the CPU
(an AVX2 build multiplies 16 columns a panel, an AVX-512 one 64): it saves the Python between the
kernels, which dominates small batches, and may lose at large ones where the library's product is
faster. The pool is free at start; the probe's writes land in its first blocks and are never read
as anyone's KV.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from pdserve.attention.base import AttentionBackend
from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.kv.kv_cache import KVCache
from pdserve.measurements import measured

log = logging.getLogger(__name__)

PROBE_BATCHES = (1, 4, 16, 64, 256)
REPEATS = 3  # timed rounds at up to SMALL rows (a round: one step each way), one fewer beyond; after a warm-up round
SMALL = 16


@dataclass(frozen=True)
class DecodeTimings:
    """Seconds of one decode step at each of `batches` rows, fused and layer by layer."""

    batches: tuple[int, ...]
    fused: tuple[float, ...]
    layers: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {"batches": list(self.batches), "fused": list(self.fused), "layers": list(self.layers)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DecodeTimings:
        return cls(tuple(data["batches"]), tuple(data["fused"]), tuple(data["layers"]))


def fused_rows(timings: DecodeTimings) -> int:
    """The largest probed batch up to which the fused step was at least as fast at every probe (0:
    slower at one row)."""
    rows = 0
    for batch, fused, layers in zip(timings.batches, timings.fused, timings.layers):
        if fused > layers:
            break
        rows = batch
    return rows


def tune_fused_rows(model, kv: KVCache, attn: AttentionBackend, depends_on: dict[str, Any]) -> DecodeTimings | None:
    """Sets `model.fused_decode.max_rows` from this machine's timings (measured now unless cached
    under `depends_on`: what identifies the model, its layout and the threads); None where the
    model has no fused step, or the backend no native decode pass to fuse with (max_rows 0)."""
    fused = getattr(model, "fused_decode", None)
    if fused is None:
        return None
    if not _fuses(model, kv, attn):
        fused.max_rows = 0  # it never serves a pass here: say so
        return None
    batches = tuple(b for b in PROBE_BATCHES if b <= fused.max_rows)
    key = {**depends_on, "batches": batches, "block_size": kv.block_size}
    timings = DecodeTimings.from_json(measured("fused-decode", key,
                                               lambda: measure_decode(model, kv, attn, batches).to_json()))
    fused.max_rows = fused_rows(timings)
    log.info("decode steps fused up to %d rows (measured here, ms a step fused / layer by layer: %s)", fused.max_rows,
             ", ".join(f"{b} rows {f * 1e3:.1f}/{m * 1e3:.1f}" for b, f, m in zip(timings.batches, timings.fused,
                                                                                  timings.layers)))
    return timings


def measure_decode(model, kv: KVCache, attn: AttentionBackend, batches: tuple[int, ...]) -> DecodeTimings:
    """Times a decode step at each of `batches` rows with the fused step and without (interleaved),
    up to the first batch where the fused step was slower."""
    fused = model.fused_decode
    with_fused, without = [], []
    try:
        for batch in batches:
            step = decode_batch(batch, kv)
            best = {True: float("inf"), False: float("inf")}
            for round in range(1 + (REPEATS if batch <= SMALL else REPEATS - 1)):
                for on in (True, False):
                    model.fused_decode = fused if on else None
                    took = _time(model, step, kv, attn)
                    best[on] = min(best[on], took) if round else best[on]  # round 0 warms both up
            with_fused.append(best[True])
            without.append(best[False])
            if best[True] > best[False]:
                break
    finally:
        model.fused_decode = fused
    return DecodeTimings(batches[:len(with_fused)], tuple(with_fused), tuple(without))


def decode_batch(rows: int, kv: KVCache) -> ForwardBatch:
    """`rows` one-token sequences, each a block's worth of context in one of the pool's blocks."""
    size, device = kv.block_size, kv.data.device
    blocks = [i % kv.num_blocks for i in range(rows)]
    seqs = tuple(SeqSpan(i, 1, size, (block,)) for i, block in enumerate(blocks))
    return ForwardBatch(
        input_ids=torch.zeros(rows, dtype=torch.long, device=device),
        positions=torch.full((rows,), size - 1, dtype=torch.long, device=device),
        slot_mapping=torch.tensor([b * size + size - 1 for b in blocks], dtype=torch.long, device=device),
        seqs=seqs,
        logits_indices=torch.arange(rows, device=device),
    )


def _fuses(model, kv: KVCache, attn: AttentionBackend) -> bool:
    """Whether a one-row decode step would run fused here (the backend's native decode pass)."""
    if kv.num_blocks == 0:
        return False
    attn.begin(decode_batch(1, kv), kv)
    return attn.native_decode_pass() is not None


def _time(model, batch: ForwardBatch, kv: KVCache, attn: AttentionBackend) -> float:
    started = time.perf_counter()
    model.forward(batch, kv, attn)
    return time.perf_counter() - started
