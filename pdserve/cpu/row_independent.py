"""The deterministic mode's projections: every row of every product computed the same way
whatever the number of rows, so a token's activations do not depend on what shares its step.

    panels: every row count from the weight in panels (pdserve/native/row_panels.c; CPU float32):
            each output is one sum over the input in order, in one vector lane, whatever tile of
            rows or thread computes it: row-independent by construction, and as fast as the
            GEMM libraries on this machine at decode and prefill sizes (docs/BENCHMARKS.md)
    tiles:  the dense product in fixed-shape tiles of rows (pdserve/model/tiled_rows.py): any
            device and dtype, where the panels cannot run

Not the GEMM libraries' own products: torch's dense `x @ W` changes a row's bits with the row
count; oneDNN's and MKL's packings gave the same bits at every row count probed on this CPU, but
nothing in their contracts says so.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from pdserve.cpu.panel_weights import load_row_panels
from pdserve.cpu.weight_layout import PANELS, WeightLayout, stream_linears
from pdserve.model.layers import Linear
from pdserve.model.row_route import PANELS as PANEL_ROUTE
from pdserve.model.row_route import RowRoute
from pdserve.model.tiled_rows import TiledRows, tile_rows

EVERY_ROW_COUNT = RowRoute((), (PANEL_ROUTE,))  # the streamed copy (panels or tiles) at every row count
TILES = "tiles"

log = logging.getLogger(__name__)


def apply_row_independent(model: nn.Module, device: str | torch.device, dtype: torch.dtype) -> WeightLayout:
    """Lays out every Linear of `model` so that each row's product is computed alone (above);
    returns the layout used."""
    panels, problem = load_row_panels(device, dtype)
    if panels is not None:
        summary = stream_linears(model, panels, EVERY_ROW_COUNT)
        log.info("deterministic: %d projections in panels at every row count (%.0f MB)", summary.linears,
                 summary.nbytes / 1e6)
        return WeightLayout("dense", PANELS, EVERY_ROW_COUNT)
    rows = tile_rows(device)
    for linear in (m for m in model.modules() if isinstance(m, Linear)):
        linear.streamed, linear.route = TiledRows(linear.weight, rows), EVERY_ROW_COUNT
    log.info("deterministic: projections in tiles of %d rows (no panels: %s)", rows, problem)
    return WeightLayout("dense", TILES, EVERY_ROW_COUNT)


def row_independent(model: nn.Module) -> bool:
    """Whether every Linear of `model` computes each row alone (apply_row_independent's work)."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    return all(m.route == EVERY_ROW_COUNT and m.streamed is not None for m in linears)
