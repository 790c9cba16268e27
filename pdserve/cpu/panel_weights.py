"""Projection weights in panels for the products of decode steps (up to PANEL_MAX_ROWS rows, the
C kernel of pdserve/native/row_panels.py), where they serve.

At one row a decode step reads every weight once and little else, so it is bound by memory
bandwidth; torch's `x @ W` (MKL's matrix-vector product) streams the embedded model's weights at
about 14-16 GB/s on the development machine, oneDNN's blocked weight slower, the panels at 21-24
GB/s against 26 GB/s the machine reads a plain tensor at. At 8 to 256 rows, one thread, the panels
multiply as fast as oneDNN's blocked weight or faster (60 against 40 GFLOP/s at 8 rows), and a
decode step's projections in one layout let the whole step run in C (fused_decode.py); beyond,
prefill chunks, oneDNN's (weight_layout.py chooses; docs/BENCHMARKS.md).
"""

from __future__ import annotations

import torch

from pdserve.cpu.packed_weights import probe_problem
from pdserve.native.loader import Loaded, warn_fallback
from pdserve.native.row_panels import ROW_PANELS, RowPanels, load_row_panels_kernel


def load_row_panels(device: str | torch.device, dtype: torch.dtype) -> Loaded[RowPanels]:
    """The kernel for a model on `device` in `dtype`, or None and why not (not a CPU, not float32,
    no compiler, or the probe's row counts computed wrongly here: the last two logged, loader.py)."""
    if torch.device(device).type != "cpu":
        return Loaded(None, f"device {device} is not a CPU")
    if dtype != torch.float32:
        return Loaded(None, f"the panels compute float32, not {dtype}")
    loaded = load_row_panels_kernel()
    if loaded.kernel is None:
        return loaded
    if problem := probe_problem(loaded.kernel.pack, "the panel kernel"):
        warn_fallback(ROW_PANELS, problem)
        return Loaded(None, problem)
    return loaded
