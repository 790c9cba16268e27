"""When a request is done, judged on its token ids (stop strings are the engine's business)."""

from __future__ import annotations

from pdserve.requests import FinishReason, Request


class StopRule:
    """A request's stop conditions, fixed for its life in a scheduler (its prompt, sampling
    settings and eos ids never change there), so each sampled token costs two checks."""

    __slots__ = ("stop_ids", "max_output")

    def __init__(self, stop_ids: frozenset[int], max_output: int):
        self.stop_ids = stop_ids  # eos (unless ignore_eos) and stop_token_ids
        self.max_output = max_output  # output length that ends it: max_tokens, or the context limit if sooner

    @classmethod
    def of(cls, request: Request, max_model_len: int) -> StopRule:
        sampling = request.sampling
        eos = () if sampling.ignore_eos else request.eos_token_ids
        return cls(frozenset((*eos, *sampling.stop_token_ids)),
                   min(sampling.max_tokens, max_model_len - request.num_prompt_tokens))

    def reason(self, request: Request) -> FinishReason | None:
        """Checked after each sampled token: eos (unless ignore_eos), stop_token_ids, max_tokens,
        then the context limit."""
        output = request.output_token_ids
        if output and output[-1] in self.stop_ids:
            return FinishReason.STOP
        if len(output) >= self.max_output:
            return FinishReason.LENGTH
        return None


def stop_reason(request: Request, max_model_len: int) -> FinishReason | None:
    """StopRule.reason for a request seen once."""
    return StopRule.of(request, max_model_len).reason(request)
