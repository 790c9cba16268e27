"""Next-token selection (greedy, temperature, top-k, top-p, min-p, per-request seeds) and the
checks on sampling settings."""

from pdserve.sampling.sampler import Sampler
from pdserve.sampling.validate import InvalidSamplingParams, validate_sampling

__all__ = ["InvalidSamplingParams", "Sampler", "validate_sampling"]
