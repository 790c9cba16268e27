"""Choosing the next token of every row in a batch.

Greedy rows (temperature 0) take the argmax, ties to the lowest id. The other rows go through
`filters.filtered_probs` and then inverse-CDF sampling in vocabulary order:

    cdf[i]  = p[0] + ... + p[i]                     (float64)
    token   = first i with cdf[i] > u * cdf[V-1]    u = the row's uniform in [0, 1)

which never picks a token of probability 0, and makes the choice a pure function of the row's
probabilities and its one uniform (see `uniforms`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pdserve.requests import SamplingParams
from pdserve.sampling.filters import SamplingTensors, filtered_probs
from pdserve.sampling.uniforms import draw_uniforms


NUMPY_ARGMAX_DTYPES = (torch.float32, torch.float64)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """[R, V] -> [R] int64: each row's first maximum (NaN counts as the maximum). On a CPU numpy's
    vectorised argmax computes it: torch's CPU argmax reduces an element at a time (64 x 49,152
    float32: 5.8 ms against 0.27, docs/BENCHMARKS.md); torch's argmax everywhere else. Both take
    the first of equal maxima and the first NaN."""
    if logits.device.type == "cpu" and logits.dtype in NUMPY_ARGMAX_DTYPES:
        return torch.from_numpy(logits.detach().numpy().argmax(axis=-1))
    return logits.argmax(dim=-1)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """probs: [R, V] (rows need not sum to 1, each has some mass); uniforms: [R] in [0, 1).
    Returns [R] int64 token ids."""
    cdf = probs.double().cumsum(dim=-1)  # [R, V]
    total = cdf[:, -1:]  # [R, 1]
    target = torch.minimum(uniforms.unsqueeze(1) * total, torch.nextafter(total, torch.zeros_like(total)))
    chosen = torch.searchsorted(cdf, target, right=True).squeeze(1)  # [R]
    return chosen.clamp_(max=probs.shape[-1] - 1)


class Sampler:
    """Stateless; one per engine. Randomness comes in through the arguments."""

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        token_indices: Sequence[int],
        generator: torch.Generator,
    ) -> list[int]:
        """logits: [S, V] float32, row i for params[i]. token_indices[i]: how many tokens row i's
        request has generated before this one (its seeded draw's index). Returns S token ids.

        All-greedy batches cost one argmax; sampled rows are filtered and drawn together.
        """
        if len(params) != logits.shape[0] or len(token_indices) != logits.shape[0]:
            raise ValueError(
                f"logits have {logits.shape[0]} rows but got {len(params)} params "
                f"and {len(token_indices)} token indices"
            )
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if not sampled:
            return argmax_rows(logits).tolist()
        if len(sampled) == len(params):
            return self._sample_rows(logits, params, token_indices, generator).tolist()
        greedy = [i for i, p in enumerate(params) if p.greedy]
        tokens = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)  # [S]
        tokens[greedy] = argmax_rows(logits[greedy])
        tokens[sampled] = self._sample_rows(
            logits[sampled], [params[i] for i in sampled], [token_indices[i] for i in sampled], generator
        )
        return tokens.tolist()

    def _sample_rows(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        token_indices: Sequence[int],
        generator: torch.Generator,
    ) -> torch.Tensor:
        """logits: [R, V] of non-greedy rows -> [R] int64."""
        settings = SamplingTensors.from_params(params, logits.device)
        probs = filtered_probs(logits.float(), settings)  # [R, V]
        uniforms = draw_uniforms(params, token_indices, generator, logits.device)  # [R]
        return inverse_cdf(probs, uniforms)
