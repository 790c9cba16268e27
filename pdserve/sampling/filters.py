"""Turning logits into the (unnormalised) distribution a token is drawn from.

Order, per row:
    1. temperature   logits / max(T, 1e-5)        (smaller T would overflow; it is greedy anyway)
    2. top_k         keep logits >= the k-th largest (ties with the k-th are kept)
    3. softmax
    4. top_p         keep the most likely tokens until the mass before a token reaches top_p
                     (the most likely token always stays; ties with the last kept are kept)
    5. min_p         keep tokens with prob >= min_p * max prob

min_p compares against the most likely token, which steps 2 and 4 always keep, so its cut is the
same whatever the order of 2, 4 and 5. Removed tokens get probability exactly 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pdserve.requests import SamplingParams

MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingTensors:
    """Per-row sampling settings as tensors on the logits' device (all shapes [R]), plus the
    batch-wide facts the filters branch on, kept on the host so branching never syncs."""

    temperature: torch.Tensor  # float32, > 0
    top_k: torch.Tensor  # int64, 0 = off
    top_p: torch.Tensor  # float32, 1 = off
    min_p: torch.Tensor  # float32, 0 = off
    max_top_k: int
    any_top_p: bool
    any_min_p: bool

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], device: torch.device) -> SamplingTensors:
        def floats(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        return cls(
            temperature=floats([max(p.temperature, MIN_TEMPERATURE) for p in params]),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            top_p=floats([p.top_p for p in params]),
            min_p=floats([p.min_p for p in params]),
            max_top_k=max((p.top_k for p in params), default=0),
            any_top_p=any(p.top_p < 1.0 for p in params),
            any_min_p=any(p.min_p > 0.0 for p in params),
        )


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """logits: [R, V]; top_k: [R] (max_top_k = its max). Logits below each row's k-th largest
    become -inf."""
    vocab = logits.shape[-1]
    k = top_k.clamp(max=vocab)
    k_max = min(max_top_k, vocab)
    if k_max == 0:
        return logits
    top_values = logits.topk(k_max, dim=-1).values  # [R, k_max]
    kth = top_values.gather(1, (k.clamp(min=1) - 1).unsqueeze(1))  # [R, 1]
    kth = torch.where(k.unsqueeze(1) > 0, kth, torch.full_like(kth, -torch.inf))
    return logits.masked_fill(logits < kth, -torch.inf)


def nucleus_threshold(sorted_probs: torch.Tensor, top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sorted_probs: [R, K] descending (the K largest of each row); top_p: [R].

    Returns (threshold [R, 1], covered [R] bool). Where `covered`, the K values hold at least
    top_p of the mass, so the nucleus lies inside them and is exactly {p >= threshold}."""
    cumulative = sorted_probs.double().cumsum(dim=-1)  # [R, K]
    mass_before = cumulative - sorted_probs.double()
    kept = (mass_before < top_p.double().unsqueeze(1)).sum(dim=-1, keepdim=True)  # [R, 1], >= 1
    threshold = sorted_probs.gather(1, kept - 1)  # [R, 1]
    covered = cumulative[:, -1] >= top_p.double()
    return threshold, covered


def apply_top_p(
    probs: torch.Tensor, top_p: torch.Tensor, candidates: tuple[int, ...] = (256, 4096)
) -> torch.Tensor:
    """probs: [R, V]; top_p: [R]. Tokens outside each row's nucleus get probability 0.

    The nucleus is looked for among each row's 256 most likely tokens, then 4096, and only
    rows whose nucleus is larger still (flat distributions) pay for a full sort."""
    vocab = probs.shape[-1]
    threshold = torch.zeros(probs.shape[0], 1, dtype=probs.dtype, device=probs.device)  # [R, 1]
    pending = torch.arange(probs.shape[0], device=probs.device)
    for size in sorted({min(c, vocab) for c in (*candidates, vocab)}):
        rows = probs[pending]  # [P, V]
        top = rows.topk(size, dim=-1).values if size < vocab else rows.sort(dim=-1, descending=True).values
        found, covered = nucleus_threshold(top, top_p[pending])
        settled = covered | (size == vocab)
        threshold[pending[settled]] = found[settled]
        pending = pending[~settled]
        if pending.numel() == 0:
            break
    threshold = torch.where(top_p.unsqueeze(1) >= 1.0, torch.zeros_like(threshold), threshold)
    return probs.masked_fill(probs < threshold, 0.0)


def apply_min_p(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """probs: [R, V]; min_p: [R]. Tokens below min_p x the row's max get probability 0."""
    cutoff = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)  # [R, 1]
    return probs.masked_fill(probs < cutoff, 0.0)


def filtered_probs(logits: torch.Tensor, settings: SamplingTensors) -> torch.Tensor:
    """logits: [R, V] float32 -> probs [R, V] float32 after the steps in the module docstring.
    Rows sum to at most 1 (not renormalised)."""
    scaled = logits / settings.temperature.unsqueeze(1)
    scaled = apply_top_k(scaled, settings.top_k, settings.max_top_k)
    probs = torch.softmax(scaled, dim=-1)
    if settings.any_top_p:
        probs = apply_top_p(probs, settings.top_p)
    if settings.any_min_p:
        probs = apply_min_p(probs, settings.min_p)
    return probs
