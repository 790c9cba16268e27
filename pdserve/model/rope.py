"""Rotary position embedding (rotate-half form) and the frequencies of each scaling models ship
with (pdserve/checkpoint/rope_scaling.py), computed in float32 exactly as the reference
implementation does, so cos/sin match bit for bit.
"""

from __future__ import annotations

import math

import torch

from pdserve.checkpoint.rope_scaling import (
    FreqFactorRopeScaling,
    Llama3RopeScaling,
    LinearRopeScaling,
    NoRopeScaling,
    RopeScaling,
)


def scaled(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """The base inverse frequencies [head_dim // 2] under `scaling`, in float32 as the reference
    implementations compute them."""
    match scaling:
        case NoRopeScaling():
            return inv_freq
        case LinearRopeScaling(factor=factor):
            return inv_freq / factor
        case Llama3RopeScaling():
            return _llama3(inv_freq, scaling)
        case FreqFactorRopeScaling(factors=factors):
            return inv_freq / torch.tensor(factors, dtype=inv_freq.dtype, device=inv_freq.device)
    raise TypeError(f"unknown rope scaling {scaling!r}")


def _llama3(inv_freq: torch.Tensor, scaling: Llama3RopeScaling) -> torch.Tensor:
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled_low = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled_low / scaling.factor + smooth * scaled_low
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled_low)


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """[head_dim // 2] float32, built on the CPU (also while a model is constructed on `meta`)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float) / head_dim
    return scaled(1.0 / (theta**exponents), scaling)


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling):
        super().__init__()
        self.register_buffer("inv_freq", inverse_frequencies(head_dim, theta, scaling), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> cos, sin: [T, 1, head_dim // 2] (broadcast over heads)."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]  # [T, D/2]
        return freqs.cos().to(dtype)[:, None, :], freqs.sin().to(dtype)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D] rotated by its token's angle, the two halves of D forming the pairs."""
    x1, x2 = x.chunk(2, dim=-1)  # [T, H, D/2] each
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
