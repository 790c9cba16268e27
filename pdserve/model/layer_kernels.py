"""The small ops of a decoder layer (RMS norm, SwiGLU's and GeGLU's products, rotary positions)
behind one interface, and its reference in torch ops (every device and dtype). Which implementation a model
runs is pdserve/cpu/layer_kernels.py's choice (the native one: pdserve/native/layer_kernels.c).

The projections and attention are not here: pdserve/cpu/weight_layout.py lays out the one,
pdserve/attention computes the other.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from pdserve.model.rope import apply_rope


class LayerKernels(Protocol):
    name: str

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x: [T, dim] -> [T, dim], x / sqrt(mean(x^2) + eps) * weight, in float32."""

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2I] -> [T, I], silu(gate) * up (may overwrite gate_up)."""

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2I] -> [T, I], gelu(gate) * up with gelu's tanh approximation."""

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

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh").mul_(up)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, cos, sin)
