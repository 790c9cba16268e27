"""Projection weights pre-packed for MKL's GEMM (CPU, float32): `--weight-layout packed`.

A plain `x @ W` copies W into the kernel's blocked panels on every call: at decode sizes (a few
hundred rows against a weight streamed from memory) that copy is a large part of the multiply.
Packed once at load (`cblas_sgemm_pack`, through torch's `mkl::_mkl_reorder_linear_weight`),
each call only reads the panels (`mkl::_mkl_linear`, `cblas_sgemm_compute`).

torch's op computes from the packed panels only when the rows equal the batch size it is told; it
is told each call's own row count. That relies on MKL's packed B not depending on the row count
it was packed for, which `packing_problem` checks on this machine (several row counts against a
dense multiply) before any model is packed; where it does not hold, the layout is unavailable.

Memory: the panels are held beside the dense weight (`Linear.weight`, still read by the tied
embedding and by anything inspecting the model), about the weights' size again.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

PACK_ROWS = 256  # the row count packing is asked for; any row count computes from the panels
MIN_PACKED_ROWS = 2  # fewer rows multiply the dense weight (measured: docs/BENCHMARKS.md)
PROBE_ROWS = (2, 3, 17, 64, 129, 300)
PROBE_SHAPE = (576, 320)  # in, out: a projection-like shape, one row block and a tail


@dataclass(frozen=True)
class PackedWeight:
    """One projection's packed panels; `weight_t` is the dense weight seen as [out, in] (a view:
    the op reads only its shape and dtype on the packed path)."""

    panels: torch.Tensor
    weight: torch.Tensor  # [in, out], the Linear's parameter (a deep copy packs its copy)
    weight_t: torch.Tensor

    @classmethod
    def pack(cls, weight: torch.Tensor) -> PackedWeight:
        """weight: [in, out] float32 on the CPU (Linear's layout; kept as given, so a deep copy of
        the module finds its own copy of the parameter)."""
        weight_t = weight.detach().t()
        return cls(torch.ops.mkl._mkl_reorder_linear_weight(weight_t.contiguous(), PACK_ROWS), weight, weight_t)

    @staticmethod
    def serves(rows: int) -> bool:
        """Whether `rows` rows multiply from the panels: one row is a matrix-vector product, bound
        by reading the weight, which the dense layout reads fastest."""
        return rows >= MIN_PACKED_ROWS

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x: [T, in] -> [T, out] (+ bias), T at least MIN_PACKED_ROWS."""
        return torch.ops.mkl._mkl_linear(x, self.panels, self.weight_t, bias, x.shape[0])

    def __deepcopy__(self, memo: dict) -> PackedWeight:
        """MKL's panels must not move (they hold addresses into themselves): a copy packs again."""
        return PackedWeight.pack(copy.deepcopy(self.weight, memo))

    @property
    def nbytes(self) -> int:
        return self.weight_t.numel() * self.weight_t.element_size()


@dataclass(frozen=True)
class PackSummary:
    linears: int
    nbytes: int  # dense bytes packed (the panels take about as much again)


def packing_problem(device: str | torch.device, dtype: torch.dtype) -> str | None:
    """Why weights cannot be packed for `device` and `dtype`, or None when they can."""
    if torch.device(device).type != "cpu":
        return f"device {device} is not a CPU"
    if dtype != torch.float32:
        return f"MKL's packed GEMM computes float32, not {dtype}"
    if not torch.backends.mkl.is_available():
        return "this torch build has no MKL"
    try:
        return _probe()
    except (RuntimeError, AttributeError) as exc:  # the ops missing from this build, or refusing
        return f"MKL's packed GEMM failed here: {exc}"


def _probe() -> str | None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(*PROBE_SHAPE, generator=gen)
    bias = torch.randn(PROBE_SHAPE[1], generator=gen)
    packed = PackedWeight.pack(weight)
    with torch.inference_mode():
        for rows in PROBE_ROWS:
            x = torch.randn(rows, PROBE_SHAPE[0], generator=gen)
            if not torch.allclose(packed(x, bias), torch.addmm(bias, x, weight), rtol=1e-4, atol=1e-4):
                return f"MKL's packed panels do not compute {rows} rows correctly on this machine"
    return None
