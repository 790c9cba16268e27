"""Recompute or swap a preempted request, by cost.

    context < recompute_below_tokens   -> recompute (cheap to redo; a swap only adds copy latency)
    context > swap_above_tokens        -> swap      (recomputing a long context costs far more)
    in between: swap when 2 * kv_bytes / host_link_bytes_per_s < context / prefill_tokens_per_s
A swap also needs room in the host pool; without it the victim is recomputed.
A time slice's victim (slicing.py) comes back within about a quantum, again and again while the
overload lasts: it is swapped whenever that is quicker than recomputing it, however short.
"""

from __future__ import annotations

import abc

from pdserve.config import PreemptionConfig
from pdserve.requests import PreemptionMode


class PreemptionModePolicy(abc.ABC):
    @abc.abstractmethod
    def choose(self, context_tokens: int, host_free_blocks: int) -> PreemptionMode:
        """Mode for a victim holding KV for `context_tokens` tokens."""

    def choose_for_slice(self, context_tokens: int, host_free_blocks: int) -> PreemptionMode:
        """Mode for a time slice's victim (it resumes soon): by default as `choose`."""
        return self.choose(context_tokens, host_free_blocks)


class CostBasedMode(PreemptionModePolicy):
    def __init__(self, cfg: PreemptionConfig, kv_bytes_per_token: int, block_size: int):
        self._cfg = cfg
        self._kv_bytes_per_token = kv_bytes_per_token
        self._block_size = block_size

    def choose(self, context_tokens: int, host_free_blocks: int) -> PreemptionMode:
        if -(-context_tokens // self._block_size) > host_free_blocks or not self._worth_swapping(context_tokens):
            return PreemptionMode.RECOMPUTE
        return PreemptionMode.SWAP

    def choose_for_slice(self, context_tokens: int, host_free_blocks: int) -> PreemptionMode:
        if -(-context_tokens // self._block_size) > host_free_blocks \
                or self.recompute_seconds(context_tokens) <= self.swap_seconds(context_tokens):
            return PreemptionMode.RECOMPUTE
        return PreemptionMode.SWAP

    def _worth_swapping(self, tokens: int) -> bool:
        if tokens < self._cfg.recompute_below_tokens:
            return False
        if tokens > self._cfg.swap_above_tokens:
            return True
        return self.swap_seconds(tokens) < self.recompute_seconds(tokens)

    def recompute_seconds(self, tokens: int) -> float:
        return tokens / self._cfg.prefill_tokens_per_s

    def swap_seconds(self, tokens: int) -> float:
        return 2 * tokens * self._kv_bytes_per_token / self._cfg.host_link_bytes_per_s


class AlwaysRecompute(PreemptionModePolicy):
    """For workers without a host pool."""

    def choose(self, context_tokens: int, host_free_blocks: int) -> PreemptionMode:
        return PreemptionMode.RECOMPUTE
