"""Next-token selection (greedy, temperature, top-k, top-p, min-p, per-request seeds), the
sampled tokens' log-probabilities, and the checks on sampling settings."""

from pdserve.sampling.logprobs import MAX_LOGPROBS, TokenLogprobs, token_logprobs
from pdserve.sampling.sampler import Sampler
from pdserve.sampling.validate import InvalidSamplingParams, validate_sampling

__all__ = ["MAX_LOGPROBS", "InvalidSamplingParams", "Sampler", "TokenLogprobs", "token_logprobs",
           "validate_sampling"]
