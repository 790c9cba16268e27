"""The rotary frequency scalings models ship with, as read from a checkpoint: values only (the
frequencies they produce are computed by pdserve/model/rope.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NoRopeScaling:
    """The base frequencies as they are."""


@dataclass(frozen=True)
class LinearRopeScaling:
    """Position interpolation: every frequency divided by `factor`."""

    factor: float


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1 scaling: low frequencies divided by `factor`, high kept, a smooth ramp between."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class FreqFactorRopeScaling:
    """Per-frequency divisors stored with the weights (GGUF `rope_freqs`)."""

    factors: tuple[float, ...]


RopeScaling = NoRopeScaling | LinearRopeScaling | Llama3RopeScaling | FreqFactorRopeScaling
