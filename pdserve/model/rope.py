"""Rotary position embedding (rotate-half form) and the frequency scalings models ship with.

Each scaling is a small frozen value that maps the base inverse frequencies to the scaled ones,
computed in float32 exactly as the reference implementation does, so cos/sin match bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class NoRopeScaling:
    def scale(self, inv_freq: torch.Tensor) -> torch.Tensor:
        return inv_freq


@dataclass(frozen=True)
class LinearRopeScaling:
    """Position interpolation: every frequency divided by `factor`."""

    factor: float

    def scale(self, inv_freq: torch.Tensor) -> torch.Tensor:
        return inv_freq / self.factor


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1 scaling: low frequencies divided by `factor`, high kept, a smooth ramp between."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def scale(self, inv_freq: torch.Tensor) -> torch.Tensor:
        old_len = self.original_max_position_embeddings
        low_freq_wavelen = old_len / self.low_freq_factor
        high_freq_wavelen = old_len / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (old_len / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)


@dataclass(frozen=True)
class FreqFactorRopeScaling:
    """Per-frequency divisors stored with the weights (GGUF `rope_freqs`)."""

    factors: tuple[float, ...]

    def scale(self, inv_freq: torch.Tensor) -> torch.Tensor:
        return inv_freq / torch.tensor(self.factors, dtype=inv_freq.dtype, device=inv_freq.device)


RopeScaling = NoRopeScaling | LinearRopeScaling | Llama3RopeScaling | FreqFactorRopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """[head_dim // 2] float32, built on the CPU (also while a model is constructed on `meta`)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float) / head_dim
    return scaling.scale(1.0 / (theta**exponents))


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
