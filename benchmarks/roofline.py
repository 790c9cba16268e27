"""The machine's bounds for one model's decode step, measured in the same run as the step itself.

    matmul rate(B): every projection of the model (its own weights, in layer order, lm_head last)
                    multiplied by a [B, in] input once; FLOPs / seconds, best of a few sweeps.
                    Cold weights as in a real step: the sweep streams all of them from memory.
                    Given the model in several weight layouts (dense, mkl, onednn), the fastest.
    peak rate:      the higher of matmul rate(B) and matmul rate(PEAK_ROWS): what the machine
                    multiplies at, where reading the weights does not limit it.
    bandwidth:      the sum of a tensor far larger than the caches; bytes / seconds.

    compute bound (tokens/s) = B / ((B x linear FLOPs + attention FLOPs) / peak rate)
    memory bound  (tokens/s) = B / ((weight bytes + KV bytes read) / bandwidth)

The bound of a step is the smaller of the two: batch 1 is memory bound (its bytes over the
bandwidth, not over how fast a matrix-vector product happens to stream them), large batches
compute bound unless the contexts are long.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pdserve.checkpoint.model_config import ModelConfig
from pdserve.model.layers import Linear

PEAK_ROWS = 256  # rows at which the projections multiply at their peak (measured: docs/BENCHMARKS.md)


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
        """FLOP/s of the model's projections at `batch` rows (the best measured so far)."""
        if batch not in self._rates:
            self.measure(batch)
        return self._rates[batch]

    def measure(self, batch: int) -> None:
        """Sweeps the projections at `batch` and PEAK_ROWS rows and reads the bandwidth again,
        keeping the best of every measurement: called between a row's timed runs, the bound sees
        the same moments of a noisy machine as the runs it divides."""
        for rows in {batch, PEAK_ROWS}:
            seconds = min(self._sweep_seconds(linears, rows) for linears in self.layouts)
            self._rates[rows] = max(self._rates.get(rows, 0.0), self._linear_flops() * rows / seconds)
        self.bandwidth = max(self.bandwidth, memory_bandwidth(1))

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

    def peak_rate(self, batch: int) -> float:
        """FLOP/s the projections reach where streaming their weights does not limit them."""
        return max(self.matmul_rate(batch), self.matmul_rate(PEAK_ROWS))

    def bound(self, batch: int, context: int) -> Bound:
        cost = self.cost(batch, context)
        compute_s = cost.flops / self.peak_rate(batch)
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
