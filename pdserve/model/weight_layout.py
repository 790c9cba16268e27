"""How the projections' weights are laid out for the matmul: a pure choice from the name asked
for and what stops packing here (`packing_problem`), then the packing itself.

    dense:  Linear.weight [in, out], multiplied by `x @ weight` (the reference; every device)
    packed: MKL's pre-packed panels beside it (CPU float32; pdserve/model/packed_weights.py)
    auto:   packed where nothing stops it, else dense
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from pdserve.model.layers import Linear
from pdserve.model.packed_weights import PackedWeight, PackSummary, packing_problem

WEIGHT_LAYOUTS = ("auto", "packed", "dense")

log = logging.getLogger(__name__)


class WeightLayoutUnavailable(RuntimeError):
    """`--weight-layout packed` where packing cannot run (not a CPU, not float32, no MKL)."""


def choose_weight_layout(name: str, problem: str | None) -> str:
    """`problem`: why packing cannot run here (None: it can). Raises ValueError for an unknown
    name, WeightLayoutUnavailable for `packed` with a problem."""
    if name not in WEIGHT_LAYOUTS:
        raise ValueError(f"unknown weight layout {name!r}; choose one of {', '.join(WEIGHT_LAYOUTS)}")
    if name == "auto":
        return "dense" if problem else "packed"
    if name == "packed" and problem:
        raise WeightLayoutUnavailable(f"packed weights unavailable: {problem}; use --weight-layout dense")
    return name


def apply_weight_layout(model: nn.Module, name: str, device: str | torch.device, dtype: torch.dtype) -> str:
    """Lays out `model`'s projections as `name` asks; returns the layout used."""
    if name == "dense":  # no probe: nothing to pack
        return "dense"
    layout = choose_weight_layout(name, packing_problem(device, dtype))
    if layout == "packed":
        summary = pack_linears(model)
        log.info("packed %d projections (%.0f MB) for MKL's GEMM", summary.linears, summary.nbytes / 1e6)
    return layout


def pack_linears(model: nn.Module) -> PackSummary:
    """Packs every Linear of `model`; each then multiplies from its panels."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    for linear in linears:
        linear.packed = PackedWeight.pack(linear.weight)
    return PackSummary(len(linears), sum(m.packed.nbytes for m in linears))
