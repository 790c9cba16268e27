"""The small ops of a decoder layer (RMS norm, SwiGLU's product, rotary positions) behind one
interface, and which implementation a model runs: a pure choice from the name asked for and what
stops the native kernels here.

    torch:  torch ops (the reference; every device and dtype)
    native: one C pass over each row (CPU float32; pdserve/model/native_kernels.py), where torch
            runs four to six ops with a fresh buffer each: the norms and rotary products of a
            batch-64 decode step of the embedded model took 11.8 ms in torch, 6.0 in C
            (docs/BENCHMARKS.md)
    auto:   native where nothing stops it, else torch

The projections and attention are not here: weight_layout.py lays out the one, pdserve/attention
computes the other.
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from pdserve.config import LAYER_KERNELS
from pdserve.model.rope import apply_rope

log = logging.getLogger(__name__)


class LayerKernelsUnavailable(RuntimeError):
    """The native kernels asked for where they cannot run (not a CPU, not float32, no compiler)."""


class LayerKernels(Protocol):
    name: str

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x: [T, dim] -> [T, dim], x / sqrt(mean(x^2) + eps) * weight, in float32."""

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2I] -> [T, I], silu(gate) * up (may overwrite gate_up)."""

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, H, D] rotated by each token's angles (cos, sin: [T, 1, D/2]; may rotate x in place)."""


class TorchKernels:
    """The reference: torch ops."""

    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight, eps)
        return weight * F.rms_norm(x.float(), weight.shape, eps=eps).to(x.dtype)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        # in place in the projection's own output: no fresh buffers between the two matmuls
        return F.silu(gate, inplace=True).mul_(up)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, cos, sin)


def choose_layer_kernels(name: str, problem: str | None) -> str:
    """`problem`: why the native kernels cannot run here (None: they can). Raises ValueError for an
    unknown name, LayerKernelsUnavailable for `native` with a problem."""
    if name not in LAYER_KERNELS:
        raise ValueError(f"unknown layer kernels {name!r}; choose one of {', '.join(LAYER_KERNELS)}")
    if name == "auto":
        return "torch" if problem else "native"
    if name == "native" and problem:
        raise LayerKernelsUnavailable(f"native layer kernels unavailable: {problem}; use --layer-kernels torch")
    return name


def apply_layer_kernels(model: nn.Module, name: str, device: str | torch.device, dtype: torch.dtype) -> str:
    """Sets the kernels every module of `model` computes its small ops with; returns which."""
    from pdserve.model.native_kernels import load_native_kernels

    native, problem = load_native_kernels(device, dtype) if name != "torch" else (None, None)
    chosen = choose_layer_kernels(name, problem)
    if chosen == "native":
        set_layer_kernels(model, native)
        log.info("layer kernels: native (norms, SwiGLU, rotary positions in pdserve/model/layer_kernels.c)")
    elif name == "auto" and torch.device(device).type == "cpu" and dtype == torch.float32:
        log.info("layer kernels: torch, not native: %s", problem)
    return chosen


def set_layer_kernels(model: nn.Module, kernels: LayerKernels) -> int:
    """Points every module that has small ops at `kernels`; returns how many."""
    modules = [m for m in model.modules() if hasattr(m, "kernels")]
    for module in modules:
        module.kernels = kernels
    return len(modules)
