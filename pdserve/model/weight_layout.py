"""How the projections' weights are laid out for the matmul: a pure choice from the name asked
for and what stops each packing here (`problems`), then the packing itself.

    dense:  Linear.weight [in, out], multiplied by `x @ weight` (the reference; every device)
    onednn: oneDNN's blocked weight beside it (CPU float32; pdserve/model/onednn_weights.py)
    mkl:    MKL's pre-packed panels beside it (CPU float32; pdserve/model/mkl_weights.py)
    auto:   the first packing of PACKINGS that nothing stops here, else dense
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from pdserve.model.layers import Linear
from pdserve.model.mkl_weights import MklPanels
from pdserve.model.onednn_weights import OneDnnWeight
from pdserve.model.packed_weights import PackedWeight, PackSummary

# the packings in the order `auto` prefers them (measured: docs/BENCHMARKS.md, "oneDNN weights and a segment kernel")
PACKINGS: dict[str, type[PackedWeight]] = {"onednn": OneDnnWeight, "mkl": MklPanels}
WEIGHT_LAYOUTS = ("auto", *PACKINGS, "dense")

log = logging.getLogger(__name__)


class WeightLayoutUnavailable(RuntimeError):
    """A packing asked for where it cannot run (not a CPU, not float32, the library missing)."""


def choose_weight_layout(name: str, problems: dict[str, str | None]) -> str:
    """`problems`: packing -> why it cannot run here (None: it can). Raises ValueError for an
    unknown name, WeightLayoutUnavailable for a packing with a problem."""
    if name not in WEIGHT_LAYOUTS:
        raise ValueError(f"unknown weight layout {name!r}; choose one of {', '.join(WEIGHT_LAYOUTS)}")
    if name == "auto":
        return next((packing for packing in PACKINGS if problems.get(packing) is None), "dense")
    if problem := problems.get(name):
        raise WeightLayoutUnavailable(f"{name} weights unavailable: {problem}; use --weight-layout dense")
    return name


def packing_problems(device: str | torch.device, dtype: torch.dtype) -> dict[str, str | None]:
    """packing -> why it cannot run on `device` in `dtype` (None: it can; each probed here)."""
    return {name: packing.problem(device, dtype) for name, packing in PACKINGS.items()}


def apply_weight_layout(model: nn.Module, name: str, device: str | torch.device, dtype: torch.dtype) -> str:
    """Lays out `model`'s projections as `name` asks; returns the layout used."""
    if name == "dense":  # no probe: nothing to pack
        return "dense"
    layout = choose_weight_layout(name, packing_problems(device, dtype))
    if layout != "dense":
        summary = pack_linears(model, PACKINGS[layout])
        log.info("packed %d projections (%.0f MB) as %s weights", summary.linears, summary.nbytes / 1e6, layout)
    return layout


def pack_linears(model: nn.Module, packing: type[PackedWeight]) -> PackSummary:
    """Packs every Linear of `model` with `packing`; each then multiplies from its packed weight."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    for linear in linears:
        linear.packed = packing.pack(linear.weight)
    return PackSummary(len(linears), sum(m.packed.nbytes for m in linears))
