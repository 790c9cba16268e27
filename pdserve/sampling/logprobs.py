"""Log-probabilities of sampled tokens (OpenAI-style `logprobs`), per request that asked.

What is computed ("raw logprobs", as vLLM does by default):

    logp   = log_softmax(logits)            the model's raw logits, float32, over the whole vocabulary
    chosen = logp[sampled token]
    top    = the k largest of logp, best first (k = the request's `logprobs`, 0..20)

BEFORE temperature, top-k, top-p and min-p: the numbers describe the model's distribution, not
the filtered one the token was drawn from. So for greedy decoding the sampled token's logprob
is the maximum of the distribution (it equals top[0] whenever k >= 1), and a sampled token
outside the filtered set can never occur but may carry a low logprob.

The whole batch costs one log_softmax and one topk over the rows that asked; rows that did not
ask cost nothing and get nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pdserve.requests import TokenLogprobs


def token_logprobs(
    logits: torch.Tensor, tokens: Sequence[int], requested: Sequence[int | None]
) -> dict[int, TokenLogprobs]:
    """logits: [S, V] (row i sampled tokens[i]); requested[i]: row i's `logprobs` setting (None:
    off). Returns row index -> TokenLogprobs for the rows that asked, and only those."""
    if not len(tokens) == len(requested) == logits.shape[0]:
        raise ValueError(f"logits have {logits.shape[0]} rows but got {len(tokens)} tokens "
                         f"and {len(requested)} logprobs settings")
    rows = [i for i, k in enumerate(requested) if k is not None]
    if not rows:
        return {}
    picked = logits if len(rows) == logits.shape[0] else logits[rows]
    logp = torch.log_softmax(picked.float(), dim=-1)  # [R, V]
    chosen_ids = torch.tensor([tokens[i] for i in rows], dtype=torch.int64, device=logp.device)
    chosen = logp.gather(1, chosen_ids.unsqueeze(1)).squeeze(1).tolist()  # [R]
    k_max = min(max(requested[i] for i in rows), logp.shape[-1])
    top_values, top_ids = logp.topk(k_max, dim=-1) if k_max else (logp[:, :0], logp[:, :0].long())  # [R, k_max]
    values, ids = top_values.tolist(), top_ids.tolist()
    return {
        row: TokenLogprobs(tokens[row], chosen[r], tuple(zip(ids[r][: requested[row]], values[r][: requested[row]])))
        for r, row in enumerate(rows)
    }
