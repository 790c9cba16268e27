"""Which layout multiplies a model's projections fastest on this machine, by row count: a short
timed probe, not a threshold measured on another CPU.

    rates = probe_products(shapes, {"dense": dense, "panels": kernel.pack, "onednn": OneDnnWeight.pack})
    rates.fastest(64)   # "panels"

The probe multiplies random weights of the decoder layers' projection shapes (each distinct
[in, out] once, counted as often as the layers have it; the head, which multiplies one row a
sampled sequence by a weight several times a layer's, is probed on its own shape at HEAD_ROWS,
each layout through a Linear into a reused buffer as the engine runs it: `as_head`)
at each of PROBE_ROWS rows, every layout in turn within each repeat so drift in the machine's
speed falls on all alike, and keeps the best of REPEATS. It runs on the threads torch has now
(the worker's --threads). pdserve/cpu/weight_layout.py turns the rates into a layout and caches
them per machine (pdserve/measurements.py); `pdserve info` prints them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pdserve.model.layers import Linear
from pdserve.model.row_route import PACKED, PANEL_MAX_ROWS, PANELS, RowRoute

PROBE_ROWS = (1, 4, 16, 64, 128, 256, 512)  # decode batches, then prefill chunks
HEAD_ROWS = tuple(r for r in PROBE_ROWS if r <= PANEL_MAX_ROWS)  # the head's rows: one a sampled sequence
REPEATS = 2
MIN_SECONDS = 1e-3  # a timing is the mean of as many products as take at least this long

Pack = Callable[[torch.Tensor], Callable[..., torch.Tensor]]  # weight [in, out] -> product(x, bias)


@dataclass(frozen=True)
class ProductRates:
    """Seconds the model's projections took (each shape as often as the model has it) in each
    layout at each of `rows` rows."""

    rows: tuple[int, ...]
    seconds: dict[str, tuple[float, ...]]

    def fastest(self, rows: int) -> str:
        """The layout fastest at the probed row count nearest above `rows` (the last beyond)."""
        i = next((i for i, r in enumerate(self.rows) if r >= rows), len(self.rows) - 1)
        return min(self.seconds, key=lambda name: self.seconds[name][i])

    def gflops(self, name: str, macs: int) -> tuple[float, ...]:
        """`name`'s rate at each probed row count, given the multiply-adds of one row (all shapes)."""
        return tuple(2 * macs * r / s / 1e9 for r, s in zip(self.rows, self.seconds[name]))

    def to_json(self) -> dict[str, Any]:
        return {"rows": list(self.rows), "seconds": {k: list(v) for k, v in self.seconds.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProductRates:
        return cls(tuple(data["rows"]), {k: tuple(v) for k, v in data["seconds"].items()})


def dense(weight: torch.Tensor) -> Callable[..., torch.Tensor]:
    """The reference product Linear runs without a packed weight."""
    return lambda x, bias: torch.matmul(x, weight)


def as_head(kind: str, pack: Pack | None = None) -> Pack:
    """weight -> the product as the head computes it: a Linear holding `pack`'s copy of the weight
    (`kind` PACKED or PANELS; DENSE: none) on that copy's route at every row count, writing into a
    [rows, out] buffer reused call after call as the engine reuses its logits (a packed product's
    result is copied there, as Linear does)."""

    def packed(weight: torch.Tensor) -> Callable[..., torch.Tensor]:
        linear = Linear(*weight.shape)
        linear.weight = nn.Parameter(weight, requires_grad=False)
        if kind == PACKED:
            linear.packed = pack(weight)
        elif kind == PANELS:
            linear.streamed = pack(weight)
        linear.route = RowRoute((), (kind,))
        buffers: dict[int, torch.Tensor] = {}

        def product(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            out = buffers.get(x.shape[0])
            if out is None:
                out = buffers[x.shape[0]] = torch.empty(x.shape[0], weight.shape[1])
            return linear(x, out=out)

        return product

    return packed


def shape_counts(weights: Iterable[torch.Tensor]) -> dict[tuple[int, int], int]:
    """[in, out] -> how many of the weights have it."""
    return dict(Counter(tuple(w.shape) for w in weights))


def probe_products(shapes: dict[tuple[int, int], int], layouts: dict[str, Pack],
                   rows: tuple[int, ...] = PROBE_ROWS) -> ProductRates:
    """Times every layout of `layouts` over `shapes` ([in, out] -> count) at each of `rows` rows."""
    gen = torch.Generator().manual_seed(0)
    weights = {shape: torch.randn(*shape, generator=gen) for shape in shapes}
    packed = {name: {shape: pack(w) for shape, w in weights.items()} for name, pack in layouts.items()}
    seconds: dict[str, list[float]] = {name: [] for name in layouts}
    with torch.inference_mode():
        for r in rows:
            inputs = {shape: torch.randn(r, shape[0], generator=gen) for shape in shapes}
            best = {name: float("inf") for name in layouts}
            for _ in range(REPEATS):
                for name, products in packed.items():
                    took = sum(count * _time(products[shape], inputs[shape]) for shape, count in shapes.items())
                    best[name] = min(best[name], took)
            for name in layouts:
                seconds[name].append(best[name])
    return ProductRates(tuple(rows), {name: tuple(s) for name, s in seconds.items()})


def _time(product: Callable[..., torch.Tensor], x: torch.Tensor) -> float:
    """Mean seconds of one product, over as many as take MIN_SECONDS (the first not counted)."""
    product(x, None)
    calls, started = 0, time.perf_counter()
    while True:
        product(x, None)
        calls += 1
        took = time.perf_counter() - started
        if took >= MIN_SECONDS:
            return took / calls
