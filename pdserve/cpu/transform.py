"""The CPU paths as a transform on a loaded model, as pdserve/parallel/shard.py applies tensor
parallelism: the model's own code is unchanged; its projections get copies of their weights in
faster layouts, its modules faster small ops, and the model a fused decode step.

    1. weight layout   the projections' packed and panel copies, and the route between them by row
                       count (weight_layout.py; `auto` measures this machine once)
    2. layer kernels   norms, SwiGLU and rotary positions in C (layer_kernels.py)
    3. fused decode    a decode step through every layer in one C call, where 1 and 2 both chose
                       their C kernels (fused_decode.py)

Off a CPU or outside float32 every step leaves the model as it was (dense, torch ops).

Deterministic mode (`--deterministic`) lays the projections out so that each row is computed alone
(row_independent.py: the panels at every row count, else fixed-shape tiles, on any device) in
place of step 1; steps 2 and 3 are the same (their C loops and the fused step compute each row
alone already).
"""

from __future__ import annotations

import torch
from torch import nn

from pdserve.cpu.fused_decode import fuse_decode
from pdserve.cpu.layer_kernels import apply_layer_kernels
from pdserve.cpu.row_independent import apply_row_independent
from pdserve.cpu.weight_layout import WeightLayout, apply_weight_layout


def apply_cpu_paths(model: nn.Module, weight_layout: str, layer_kernels: str, device: str | torch.device,
                    dtype: torch.dtype, deterministic: bool = False) -> WeightLayout:
    """Lays out `model`'s projections as `weight_layout` asks (`deterministic`: row by row, whatever
    it asks), sets its small ops to `layer_kernels` and fuses its decode steps where it can;
    returns the layout used. Raises
    ValueError for an unknown name, WeightLayoutUnavailable or LayerKernelsUnavailable for a
    native choice asked for where it cannot run."""
    if deterministic:
        layout = apply_row_independent(model, device, dtype)
    else:
        layout = apply_weight_layout(model, weight_layout, device, dtype)
    apply_layer_kernels(model, layer_kernels, device, dtype)
    fuse_decode(model)
    return layout
