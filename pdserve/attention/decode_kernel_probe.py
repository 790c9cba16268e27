"""Whether torch-batched's decodes run on the C kernel (pdserve/native/paged_decode.py) or the
sparse products (pool_rows.py) on this machine: both compute the same attention, and which is
faster depends on the CPU the kernel was built for (its 16-float vectors fill one AVX-512
register, two AVX2 ones).

The probe attends one layer of a synthetic pool of the model's KV shape at PROBE_SHAPES (decode
batch, context) both ways, every shape in turn within each repeat, best of REPEATS, and keeps
the kernel whose total is smaller; cached per machine and model shape (pdserve/measurements.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from pdserve.attention.base import AttentionBackend
from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.attention.batched_backend import BatchedTorchBackend
from pdserve.attention.pool_rows import SUPPORTED_DTYPES
from pdserve.kv.kv_cache import KVCache
from pdserve.kv.kv_shape import KVShape
from pdserve.measurements import measured

log = logging.getLogger(__name__)

PROBE_SHAPES = ((1, 1024), (16, 512), (64, 256))  # (decode sequences, context tokens)
REPEATS = 3


@dataclass(frozen=True)
class DecodeKernelTimings:
    """Seconds one layer's decode attention took at each probed shape, by kernel."""

    shapes: tuple[tuple[int, int], ...]
    native: tuple[float, ...]
    sparse: tuple[float, ...]

    @property
    def native_faster(self) -> bool:
        return sum(self.native) <= sum(self.sparse)

    def to_json(self) -> dict[str, Any]:
        return {"shapes": [list(s) for s in self.shapes], "native": list(self.native), "sparse": list(self.sparse)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DecodeKernelTimings:
        return cls(tuple(tuple(s) for s in data["shapes"]), tuple(data["native"]), tuple(data["sparse"]))


def tune_decode_kernel(attn: AttentionBackend, shape: KVShape, heads: int,
                       pool: torch.dtype = torch.float32) -> DecodeKernelTimings | None:
    """Keeps `attn`'s C kernel for decodes only where it measured faster here than the sparse
    products, on torch's threads now; None where there is nothing to choose (another backend, no
    kernel built, or a `pool` of half precision: the sparse products do not read one)."""
    if not isinstance(attn, BatchedTorchBackend) or attn.native is None or pool not in SUPPORTED_DTYPES:
        return None
    key = {"kernel": attn.native.library_name, "threads": torch.get_num_threads(), "heads": heads,
           "kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim, "block_size": shape.block_size,
           "shapes": PROBE_SHAPES}
    timings = DecodeKernelTimings.from_json(measured("decode-attention", key,
                                                     lambda: measure_kernels(attn, shape, heads).to_json()))
    if not timings.native_faster:
        attn.native = None
    log.info("torch-batched decodes: %s (measured here, ms a layer C kernel / sparse products: %s)",
             "the C kernel" if timings.native_faster else "sparse products",
             ", ".join(f"{b}x{c} {n * 1e3:.2f}/{s * 1e3:.2f}" for (b, c), n, s in
                       zip(timings.shapes, timings.native, timings.sparse)))
    return timings


def measure_kernels(attn: BatchedTorchBackend, shape: KVShape, heads: int) -> DecodeKernelTimings:
    gen = torch.Generator().manual_seed(0)
    kernels = {"native": BatchedTorchBackend(attn.native), "sparse": BatchedTorchBackend(None)}
    best = {name: [float("inf")] * len(PROBE_SHAPES) for name in kernels}
    cases = [_case(batch, context, shape, heads, gen) for batch, context in PROBE_SHAPES]
    with torch.inference_mode():
        for _ in range(REPEATS + 1):  # the first round warms every case up
            for i, case in enumerate(cases):
                for name, backend in kernels.items():
                    took = _time(backend, *case)
                    best[name][i] = min(best[name][i], took) if _ else best[name][i]
    return DecodeKernelTimings(PROBE_SHAPES, tuple(best["native"]), tuple(best["sparse"]))


def _case(batch: int, context: int, shape: KVShape, heads: int, gen: torch.Generator):
    per_seq = -(-context // shape.block_size)
    kv = KVCache(KVShape(1, shape.num_kv_heads, shape.head_dim, shape.block_size), batch * per_seq,
                 torch.float32, "cpu")
    kv.data.normal_(generator=gen)
    seqs = tuple(SeqSpan(i, 1, context, tuple(range(i * per_seq, (i + 1) * per_seq))) for i in range(batch))
    last = [i * per_seq * shape.block_size + context - 1 for i in range(batch)]
    fb = ForwardBatch(torch.zeros(batch, dtype=torch.long), torch.full((batch,), context - 1, dtype=torch.long),
                      torch.tensor(last, dtype=torch.long), seqs, torch.arange(batch))
    q = torch.randn(batch, heads, shape.head_dim, generator=gen)
    k, v = (torch.randn(batch, shape.num_kv_heads, shape.head_dim, generator=gen) for _ in range(2))
    return fb, kv, q, k, v


def _time(backend: BatchedTorchBackend, batch: ForwardBatch, kv: KVCache, q, k, v) -> float:
    started = time.perf_counter()
    backend.begin(batch, kv)
    backend.forward(0, q, k, v, kv)
    return time.perf_counter() - started
