"""oneDNN's blocked weight (`--weight-layout onednn`; CPU, float32): the weight reordered once at
load into the layout oneDNN's inner-product primitive computes from (torch's
`mkldnn::_reorder_linear_weight`, an opaque tensor), multiplied through `mkldnn::_linear_pointwise`.

oneDNN generates its kernels for the instruction sets the CPU reports; on an AMD EPYC with AVX-512
a decode step of the embedded model ran 1.25-1.4x faster at batches 8-128 this way than from MKL's
panels (docs/BENCHMARKS.md). The reorder is asked for a row count (`HINT_ROWS`); any row count
computes from it, which `OneDnnWeight.problem` checks on this machine before any model is packed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from pdserve.cpu.packed_weights import packing_problem

HINT_ROWS = 256  # the row count the blocked layout is chosen for (decode batches and prefill chunks alike)


@dataclass(frozen=True)
class OneDnnWeight:
    """One projection's blocked weight (opaque: no strides, no storage a copy could read)."""

    blocked: torch.Tensor
    weight: torch.Tensor  # [in, out], the Linear's parameter (a deep copy reorders its copy)

    @classmethod
    def pack(cls, weight: torch.Tensor) -> OneDnnWeight:
        """weight: [in, out] float32 on the CPU (Linear's layout, kept as given)."""
        return cls(torch.ops.mkldnn._reorder_linear_weight(weight.detach().t().contiguous(), HINT_ROWS), weight)

    @staticmethod
    def problem(device: str | torch.device, dtype: torch.dtype) -> str | None:
        """Why weights cannot be reordered for oneDNN on `device` in `dtype`, or None when they can."""
        return packing_problem(device, dtype, "oneDNN", torch.backends.mkldnn.is_available(), OneDnnWeight.pack)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x: [T, in] -> [T, out] (+ bias), T at least MIN_PACKED_ROWS."""
        return torch.ops.mkldnn._linear_pointwise(x, self.blocked, bias, "none", [], "")

    def __deepcopy__(self, memo: dict) -> OneDnnWeight:
        """An opaque tensor cannot be copied: a copy reorders its own copy of the weight."""
        return OneDnnWeight.pack(copy.deepcopy(self.weight, memo))

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()
