"""The machine's bounds for one model's decode step, measured in the same run as the step itself.

    matmul rate(B): every projection of the model (its own weights, in layer order, lm_head last)
                    multiplied by a [B, in] input once; FLOPs / seconds, best of a few sweeps.
                    Cold weights as in a real step: the sweep streams all of them from memory.
                    Given the model in several weight layouts (dense, mkl, onednn), the fastest.
    bandwidth:      the sum of a tensor far larger than the caches; bytes / seconds.

    compute bound (tokens/s) = B / ((B x linear FLOPs + attention FLOPs) / matmul rate(B))
    memory bound  (tokens/s) = B / ((weight bytes + KV bytes read) / bandwidth)

The bound of a step is the smaller of the two (batch 1 is memory bound, large batches compute
bound unless the contexts are long).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pdserve.model.config import ModelConfig
from pdserve.model.layers import Linear


@dataclass(frozen=True)
class StepCost:
    flops: float  # per step
    weight_bytes: float
    kv_bytes: float


@dataclass(frozen=True)
class Bound:
    compute: float  # tokens/s
    memory: float

    @property
    def tokens_per_s(self) -> float:
        return min(self.compute, self.memory)

    @property
    def by(self) -> str:
        return "flop" if self.compute <= self.memory else "mem"


class Roofline:
    def __init__(self, models: Sequence[torch.nn.Module], config: ModelConfig, repeats: int = 3):
        """models: one model in each weight layout to measure (the same weights)."""
        self.layouts = [[m for m in model.modules() if isinstance(m, Linear)] for model in models]
        self.linears = self.layouts[0]
        self.config = config
        self.repeats = repeats
        self.bandwidth = memory_bandwidth(repeats)  # bytes/s
        self._rates: dict[int, float] = {}

    def matmul_rate(self, batch: int) -> float:
        """FLOP/s of the model's projections at `batch` rows (measured once per batch size)."""
        if batch not in self._rates:
            seconds = min(self._sweep_seconds(linears, batch) for linears in self.layouts)
            self._rates[batch] = self._linear_flops() * batch / seconds
        return self._rates[batch]

    def measured_rates(self) -> dict[int, float]:
        """batch -> FLOP/s, for the batch sizes measured so far."""
        return dict(sorted(self._rates.items()))

    def cost(self, batch: int, context: int) -> StepCost:
        """One decode step of `batch` sequences, each attending `context` positions."""
        c = self.config
        attention = 4.0 * c.num_layers * c.num_heads * c.head_dim * context * batch
        weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in self.linears)
        element = self.linears[0].weight.element_size()
        kv = batch * context * c.num_layers * 2 * c.num_kv_heads * c.head_dim * element
        return StepCost(self._linear_flops() * batch + attention, weight_bytes, kv)

    def bound(self, batch: int, context: int) -> Bound:
        cost = self.cost(batch, context)
        compute_s = cost.flops / self.matmul_rate(batch)
        memory_s = (cost.weight_bytes + cost.kv_bytes) / self.bandwidth
        return Bound(batch / compute_s, batch / memory_s)

    def _linear_flops(self) -> float:
        return 2.0 * sum(m.weight.shape[0] * m.weight.shape[1] for m in self.linears)

    @torch.inference_mode()
    def _sweep_seconds(self, linears: list[Linear], batch: int) -> float:
        inputs = {m.weight.shape[0]: torch.randn(batch, m.weight.shape[0]) for m in linears}
        best = float("inf")
        for _ in range(self.repeats + 1):  # the first sweep warms up
            start = time.perf_counter()
            for m in linears:
                m(inputs[m.weight.shape[0]])
            best = min(best, time.perf_counter() - start)
        return best


def memory_bandwidth(repeats: int, nbytes: int = 512 * 1024 * 1024) -> float:
    """Read bandwidth in bytes/s: the best of `repeats` sums of a float32 tensor of `nbytes`."""
    data = torch.ones(nbytes // 4)
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return nbytes / best
