"""A projection whose every row is computed the same way whatever the number of rows: the dense
product in tiles of a fixed row count, the last one padded with zero rows, one call per tile.

    x [T, in] -> ceil(T / R) calls of [R, in] @ W [in, out]     R = TiledRows.rows

A GEMM library picks its kernel (and any split of the inner dimension) by the product's shape,
so a row's sums depend on how many rows share its call: torch's CPU `x @ W` gives a row other
bits at 1, 2, 7 or 64 rows (docs/BENCHMARKS.md, "Deterministic mode"). Every call here has one
shape, and a row's place inside its tile does not change its sums (checked on this CPU by
tests/model/test_batch_invariance.py). The deterministic mode's product where the panels of
pdserve/cpu/panel_weights.py cannot run (another dtype, another device, no C compiler).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CPU_TILE_ROWS = 16
GPU_TILE_ROWS = 64


@dataclass(frozen=True)
class TiledRows:
    """One projection's weight (the Linear's own [in, out] parameter), multiplied in tiles."""

    weight: torch.Tensor
    rows: int

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
        """x: [T, in] -> [T, out] (+ bias), into `out` where given."""
        count, tile = x.shape[0], self.rows
        if out is None:
            out = torch.empty(count, self.weight.shape[1], dtype=self.weight.dtype, device=self.weight.device)
        padded = x.new_zeros(-(-count // tile) * tile, x.shape[1])
        padded[:count] = x
        for first in range(0, count, tile):
            y = torch.matmul(padded[first:first + tile], self.weight)  # [R, out]: one shape every call
            out[first:first + tile] = y[:count - first]
        return out if bias is None else out.add_(bias)

    @property
    def nbytes(self) -> int:
        """The dense weight's (no copy is made: the tiles read it)."""
        return self.weight.numel() * self.weight.element_size()


def tile_rows(device: torch.device | str) -> int:
    return GPU_TILE_ROWS if torch.device(device).type == "cuda" else CPU_TILE_ROWS
