"""The one uniform number each sampled row consumes per step.

A seeded request's n-th token uses `seeded_uniform(seed, n)`: a hash of (seed, n) alone, stable
across processes, machines and torch versions. Nothing about the batch, the prompt's chunking or
a preemption enters it, so a seeded request replays identically. Unseeded rows draw from the
engine's generator.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from pdserve.requests import SamplingParams

_MANTISSA_BITS = 53


def seeded_uniform(seed: int, index: int) -> float:
    """A number in [0, 1) determined by (seed, index) only."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8, person=b"pdserve-sample").digest()
    return (int.from_bytes(digest, "little") >> (64 - _MANTISSA_BITS)) / float(1 << _MANTISSA_BITS)


def draw_uniforms(
    params: Sequence[SamplingParams],
    token_indices: Sequence[int],
    generator: torch.Generator,
    device: torch.device,
) -> torch.Tensor:
    """One uniform in [0, 1) per row: [R] float64 on `device`. Seeded rows from their hash,
    the others, in row order, from `generator`."""
    unseeded = [row for row, p in enumerate(params) if p.seed is None]
    values = torch.tensor(
        [seeded_uniform(p.seed, n) if p.seed is not None else 0.0 for p, n in zip(params, token_indices)],
        dtype=torch.float64,
    ).to(device)
    if unseeded:
        drawn = torch.rand(len(unseeded), generator=generator, dtype=torch.float64, device=generator.device)
        values[torch.tensor(unseeded, device=device)] = drawn.to(device)
    return values
