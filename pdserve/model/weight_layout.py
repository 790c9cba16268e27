"""How the projections' weights are laid out for the matmul: a pure choice from the name asked
for and what stops each packing here (`problems`), then the packing itself.

    dense:  Linear.weight [in, out], multiplied by `x @ weight` (the reference; every device)
    onednn: oneDNN's blocked weight beside it (CPU float32; pdserve/model/onednn_weights.py)
    mkl:    MKL's pre-packed panels beside it (CPU float32; pdserve/model/mkl_weights.py)
    panels: products of up to PANEL_MAX_ROWS rows (decode steps) from the weight in panels, by
            a C kernel (CPU float32; pdserve/model/panel_weights.py); more rows dense
    auto:   the panels for decode steps where they build, and for more rows (prefill chunks) the
            first packing of PACKINGS that nothing stops here, else dense

The choice is a `WeightLayout`: the layout of products of many rows, and of few (up to
PANEL_MAX_ROWS).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from pdserve.model.layers import Linear
from pdserve.model.mkl_weights import MklPanels
from pdserve.model.onednn_weights import OneDnnWeight
from pdserve.model.packed_weights import PackedWeight, PackSummary
from pdserve.model.panel_weights import PANEL_MAX_ROWS, RowPanels, load_row_panels

# the packings in the order `auto` prefers them (measured: docs/BENCHMARKS.md, "oneDNN weights and a segment kernel")
PACKINGS: dict[str, type[PackedWeight]] = {"onednn": OneDnnWeight, "mkl": MklPanels}
PANELS = "panels"
WEIGHT_LAYOUTS = ("auto", *PACKINGS, PANELS, "dense")

log = logging.getLogger(__name__)


class WeightLayoutUnavailable(RuntimeError):
    """A packing asked for where it cannot run (not a CPU, not float32, the library missing)."""


@dataclass(frozen=True)
class WeightLayout:
    many_rows: str  # a packing of PACKINGS, or dense
    few_rows: str | None = None  # PANELS for products of up to PANEL_MAX_ROWS rows, or None (as many_rows)

    def __str__(self) -> str:
        if self.few_rows is None:
            return self.many_rows
        return f"{self.few_rows} up to {PANEL_MAX_ROWS} rows, {self.many_rows} beyond"


def choose_weight_layout(name: str, problems: dict[str, str | None]) -> WeightLayout:
    """`problems`: packing (of PACKINGS, or PANELS) -> why it cannot run here (None: it can).
    Raises ValueError for an unknown name, WeightLayoutUnavailable for a packing with a problem."""
    if name not in WEIGHT_LAYOUTS:
        raise ValueError(f"unknown weight layout {name!r}; choose one of {', '.join(WEIGHT_LAYOUTS)}")
    if name == "auto":
        many = next((packing for packing in PACKINGS if problems.get(packing) is None), "dense")
        return WeightLayout(many, None if problems.get(PANELS) else PANELS)
    if problem := problems.get(name):
        raise WeightLayoutUnavailable(f"{name} weights unavailable: {problem}; use --weight-layout dense")
    return WeightLayout("dense", PANELS) if name == PANELS else WeightLayout(name)


def packing_problems(device: str | torch.device, dtype: torch.dtype) -> dict[str, str | None]:
    """packing -> why it cannot run on `device` in `dtype` (None: it can; each probed here)."""
    return {name: packing.problem(device, dtype) for name, packing in PACKINGS.items()}


def apply_weight_layout(model: nn.Module, name: str, device: str | torch.device, dtype: torch.dtype) -> WeightLayout:
    """Lays out `model`'s projections as `name` asks; returns the layout used."""
    if name == "dense":  # no probe: nothing to pack
        return WeightLayout("dense")
    problems = packing_problems(device, dtype) if name != PANELS else {}
    panels, problems[PANELS] = load_row_panels(device, dtype) if name in ("auto", PANELS) else (None, None)
    layout = choose_weight_layout(name, problems)
    if layout.many_rows != "dense":
        summary = pack_linears(model, PACKINGS[layout.many_rows])
        log.info("packed %d projections (%.0f MB) as %s weights", summary.linears, summary.nbytes / 1e6,
                 layout.many_rows)
    if layout.few_rows == PANELS:
        summary = stream_linears(model, panels)
        log.info("packed %d projections (%.0f MB) in panels for products of up to %d rows", summary.linears,
                 summary.nbytes / 1e6, PANEL_MAX_ROWS)
    elif name == "auto" and torch.device(device).type == "cpu" and dtype == torch.float32:
        log.info("no panels for decode steps: %s", problems[PANELS])
    return layout


def pack_linears(model: nn.Module, packing: type[PackedWeight]) -> PackSummary:
    """Packs every Linear of `model` with `packing`; each then multiplies from its packed weight."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    for linear in linears:
        linear.packed = packing.pack(linear.weight)
    return PackSummary(len(linears), sum(m.packed.nbytes for m in linears))


def stream_linears(model: nn.Module, panels: RowPanels) -> PackSummary:
    """Packs every Linear of `model` in panels; each then multiplies up to PANEL_MAX_ROWS rows from
    them."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    for linear in linears:
        linear.streamed = panels.pack(linear.weight)
    return PackSummary(len(linears), sum(m.streamed.nbytes for m in linears))
