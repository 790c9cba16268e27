"""When a request is done, judged on its token ids (stop strings are the engine's business)."""

from __future__ import annotations

from pdserve.requests import FinishReason, Request


def stop_reason(request: Request, max_model_len: int) -> FinishReason | None:
    """Checked after each sampled token: eos (unless ignore_eos), stop_token_ids, max_tokens,
    then the context limit."""
    sampling = request.sampling
    if request.output_token_ids:
        last = request.output_token_ids[-1]
        if (not sampling.ignore_eos and last in request.eos_token_ids) or last in sampling.stop_token_ids:
            return FinishReason.STOP
    if len(request.output_token_ids) >= sampling.max_tokens or request.num_tokens >= max_model_len:
        return FinishReason.LENGTH
    return None
