"""Next-token selection (greedy, temperature, top-k, top-p, min-p, per-request seeds) and the
sampled tokens' log-probabilities; the checks on sampling settings are in pdserve/validation.py."""

from pdserve.sampling.logprobs import TokenLogprobs, token_logprobs
from pdserve.sampling.sampler import Sampler

__all__ = ["Sampler", "TokenLogprobs", "token_logprobs"]
