"""How many of a request's uncomputed tokens go into this step."""

from __future__ import annotations

import abc


class ChunkPolicy(abc.ABC):
    @abc.abstractmethod
    def size(self, remaining: int, budget_left: int, step_tokens: int) -> int:
        """Tokens to compute now (0: not this step). remaining > 0 tokens lack KV; budget_left
        tokens are left of the step's budget; step_tokens are already scheduled."""


class CappedChunks(ChunkPolicy):
    """Chunked prefill: as much as the budget allows, at most `max_chunk_tokens` per request
    so one long prompt cannot take the whole step."""

    def __init__(self, max_chunk_tokens: int):
        self._cap = max_chunk_tokens

    def size(self, remaining: int, budget_left: int, step_tokens: int) -> int:
        return max(0, min(remaining, budget_left, self._cap))


class WholePrompt(ChunkPolicy):
    """No chunking: the whole remainder or nothing. A remainder larger than the budget runs
    alone in an otherwise empty step (the prefill stall)."""

    def size(self, remaining: int, budget_left: int, step_tokens: int) -> int:
        return remaining if remaining <= budget_left or step_tokens == 0 else 0
