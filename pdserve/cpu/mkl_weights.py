"""MKL's packed panels (`--weight-layout mkl`; CPU, float32): `cblas_sgemm_pack` once at load,
through torch's `mkl::_mkl_reorder_linear_weight`; each call `cblas_sgemm_compute` through
`mkl::_mkl_linear`, reading the panels only.

torch's op computes from the packed panels only when the rows equal the batch size it is told; it
is told each call's own row count. That relies on MKL's packed B not depending on the row count
it was packed for, which `MklPanels.problem` checks on this machine (several row counts against a
dense multiply, pdserve/cpu/packed_weights.py) before any model is packed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from pdserve.cpu.packed_weights import packing_problem

PACK_ROWS = 256  # the row count packing is asked for; any row count computes from the panels


@dataclass(frozen=True)
class MklPanels:
    """One projection's packed panels; `weight_t` is the dense weight seen as [out, in] (a view:
    the op reads only its shape and dtype on the packed path)."""

    panels: torch.Tensor
    weight: torch.Tensor  # [in, out], the Linear's parameter (a deep copy packs its copy)
    weight_t: torch.Tensor

    @classmethod
    def pack(cls, weight: torch.Tensor) -> MklPanels:
        """weight: [in, out] float32 on the CPU (Linear's layout; kept as given, so a deep copy of
        the module finds its own copy of the parameter)."""
        weight_t = weight.detach().t()
        return cls(torch.ops.mkl._mkl_reorder_linear_weight(weight_t.contiguous(), PACK_ROWS), weight, weight_t)

    @staticmethod
    def problem(device: str | torch.device, dtype: torch.dtype) -> str | None:
        """Why weights cannot be packed for MKL on `device` in `dtype`, or None when they can."""
        return packing_problem(device, dtype, "MKL", torch.backends.mkl.is_available(), MklPanels.pack)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x: [T, in] -> [T, out] (+ bias), T at least MIN_PACKED_ROWS."""
        return torch.ops.mkl._mkl_linear(x, self.panels, self.weight_t, bias, x.shape[0])

    def __deepcopy__(self, memo: dict) -> MklPanels:
        """MKL's panels must not move (they hold addresses into themselves): a copy packs again."""
        return MklPanels.pack(copy.deepcopy(self.weight, memo))

    @property
    def nbytes(self) -> int:
        return self.weight_t.numel() * self.weight_t.element_size()
