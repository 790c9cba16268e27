"""What a request asks of the logits before its next token is chosen, greedy or sampled, as OpenAI
and vLLM define it: a bias per token, presence and frequency penalties over the tokens it generated,
a repetition penalty over the prompt's and the output's tokens, and no end of sequence before
`min_tokens`. The same on every worker that samples (the prefill worker's first token, the decode
worker's next ones, a resume's or a move's continuation), since each reads the request's own
tokens. The log-probabilities a request asks for stay the model's, before these."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pdserve.requests import Request, SamplingParams


def adjust_logits(logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
    """[S, V] logits, row i of `requests[i]`: a copy with what each request asks applied, or
    `logits` itself when none asks anything."""
    rows = [i for i, r in enumerate(requests) if r.sampling.adjusts_logits]
    if not rows:
        return logits
    out = logits.clone()
    for i in rows:
        adjust_row(out[i], requests[i])
    return out


def adjust_row(row: torch.Tensor, request: Request) -> None:
    """In place, on one request's [V] logits."""
    s: SamplingParams = request.sampling
    output = request.output_token_ids
    if s.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(request.prompt_token_ids) | set(output)), dtype=torch.int64, device=row.device)
        values = row[seen]
        row[seen] = torch.where(values > 0, values / s.repetition_penalty, values * s.repetition_penalty)
    if output and (s.presence_penalty or s.frequency_penalty):
        ids, counts = torch.tensor(output, dtype=torch.int64, device=row.device).unique(return_counts=True)
        row[ids] -= s.frequency_penalty * counts.to(row.dtype) + s.presence_penalty
    if s.logit_bias:
        ids = torch.tensor([t for t, _ in s.logit_bias], dtype=torch.int64, device=row.device)
        row[ids] += torch.tensor([b for _, b in s.logit_bias], dtype=row.dtype, device=row.device)
    if len(output) < s.min_tokens:
        ends = sorted({*request.eos_token_ids, *s.stop_token_ids})
        if ends:
            row[torch.tensor(ends, dtype=torch.int64, device=row.device)] = float("-inf")
