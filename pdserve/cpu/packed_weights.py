"""Projection weights laid out for a CPU GEMM library, beside the dense weight: the interface every
packing offers (Linear's WeightCopy, packed and probed), and the probe every packing passes on this
machine before a model is packed with it (weight_layout.py chooses which).

A plain `x @ W` lays W out in the kernel's blocked panels on every call: at decode sizes (a few
hundred rows against a weight streamed from memory) that copy is a large part of the multiply.
Packed once at load, each call only reads the library's own layout.

    mkl_weights.py     MKL's packed panels (cblas_sgemm_pack, then cblas_sgemm_compute)
    onednn_weights.py  oneDNN's blocked weight (the inner-product primitive's own format)

Memory: the packed weight is held beside the dense one (`Linear.weight`, still read by the tied
embedding and by anything inspecting the model), about the weights' size again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from pdserve.model.layers import WeightCopy

PROBE_ROWS = (2, 3, 17, 64, 129, 300)
PROBE_SHAPE = (576, 320)  # in, out: a projection-like shape, one row block and a tail


class PackedWeight(WeightCopy, Protocol):
    """One projection's weight in a library's layout; `weight` is the dense [in, out] parameter it
    was packed from (a deep copy of the module packs the copy's own parameter again)."""

    @classmethod
    def pack(cls, weight: torch.Tensor) -> PackedWeight:
        """weight: [in, out] float32 on the CPU (Linear's layout)."""

    @staticmethod
    def problem(device: str | torch.device, dtype: torch.dtype) -> str | None:
        """Why weights cannot be packed this way on `device` in `dtype` (probed), or None."""

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x: [T, in] -> [T, out] (+ bias), T at least MIN_PACKED_ROWS (pdserve/model/row_route.py)."""


@dataclass(frozen=True)
class PackSummary:
    linears: int
    nbytes: int  # dense bytes packed (the packed copies take about as much again)


def packing_problem(device: str | torch.device, dtype: torch.dtype, library: str, available: bool,
                    pack: Callable[[torch.Tensor], PackedWeight]) -> str | None:
    """Why `library`'s packing (`pack`) cannot serve `device` and `dtype`: not a CPU, not float32,
    the library missing from this torch build (`available` False), or failing the probe."""
    if torch.device(device).type != "cpu":
        return f"device {device} is not a CPU"
    if dtype != torch.float32:
        return f"{library}'s packed weights compute float32, not {dtype}"
    if not available:
        return f"this torch build has no {library}"
    return probe_problem(pack, library)


def probe_problem(pack: Callable[[torch.Tensor], PackedWeight], library: str) -> str | None:
    """Why weights packed by `pack` do not compute every probed row count like a dense addmm on
    this machine (the ops missing from this torch build, refusing, or computing wrongly), or None."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(*PROBE_SHAPE, generator=gen)
    bias = torch.randn(PROBE_SHAPE[1], generator=gen)
    try:
        packed = pack(weight)
        with torch.inference_mode():
            for rows in PROBE_ROWS:
                x = torch.randn(rows, PROBE_SHAPE[0], generator=gen)
                if not torch.allclose(packed(x, bias), torch.addmm(bias, x, weight), rtol=1e-4, atol=1e-4):
                    return f"{library}'s packed weights do not compute {rows} rows correctly on this machine"
    except (RuntimeError, AttributeError) as exc:
        return f"{library}'s packed GEMM failed here: {exc}"
    return None
