"""How many of a request's uncomputed tokens go into this step.

    CappedChunks   tokens: as many as the step's token budget leaves, at most max_chunk_tokens
    TimedChunks    time: as many as keep the step's predicted seconds within a target (and the
                   token caps above), never fewer than a minimum in the step's first prefill chunk
    WholePrompt    the whole remainder or nothing (fcfs)

`SchedulerConfig.chunking` picks tokens or time for the chunked and decode-first policies.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pdserve.scheduler.step_cost import StepCostModel, StepLoad

if TYPE_CHECKING:
    from pdserve.scheduler.output import ScheduledChunk
    from pdserve.scheduler.plan import StepPlan


class ChunkPolicy(abc.ABC):
    @abc.abstractmethod
    def size(self, remaining: int, start: int, plan: StepPlan) -> int:
        """Tokens to compute now (0: not this step). remaining > 0 tokens lack KV, the first of them
        at position `start`; `plan` is the step so far (read only: its budget left, its chunks)."""

    def observe(self, chunks: Sequence[ScheduledChunk], seconds: float) -> None:
        """A step of `chunks` took `seconds` (from scheduling to its tokens), for a policy that learns."""

    def predicted_s(self, chunks: Sequence[ScheduledChunk]) -> float | None:
        """The seconds it predicts a step of `chunks` takes (None: it predicts none)."""
        return None


class CappedChunks(ChunkPolicy):
    """Chunked prefill: as much as the budget allows, at most `max_chunk_tokens` per request
    so one long prompt cannot take the whole step."""

    def __init__(self, max_chunk_tokens: int):
        self._cap = max_chunk_tokens

    def size(self, remaining: int, start: int, plan: StepPlan) -> int:
        return max(0, min(remaining, plan.budget_left, self._cap))


class TimedChunks(ChunkPolicy):
    """Chunked prefill sized by time (as Sarathi-Serve sizes chunks by the TBT objective): the
    largest chunk whose step, with everything already in it, `cost` predicts within `target_s`;
    `max_chunk_tokens` and the token budget still cap it. The step's first prefill chunk gets at
    least `min_tokens` (or what remains), so a prompt advances even in a step its decodes already
    fill; a later one gets that many or none."""

    def __init__(self, cost: StepCostModel, target_s: float, min_tokens: int, max_chunk_tokens: int):
        if target_s <= 0 or min_tokens < 1:
            raise ValueError(f"a step time target > 0 and a minimum chunk >= 1, got {target_s}, {min_tokens}")
        self.cost = cost
        self._target_s = target_s
        self._min = min_tokens
        self._cap = max_chunk_tokens

    def size(self, remaining: int, start: int, plan: StepPlan) -> int:
        cap = min(remaining, plan.budget_left, self._cap)
        if cap <= 0:
            return 0
        load = plan.load()
        fits = self._fitting(load, start, cap)
        least = min(cap, self._min)
        if load.prefill_tokens == 0:
            return max(fits, least)
        return fits if fits >= least else 0

    def _fitting(self, load: StepLoad, start: int, cap: int) -> int:
        """The most tokens, up to `cap`, within the target (the cost grows with the chunk)."""
        low, high = 0, cap
        while low < high:
            mid = (low + high + 1) // 2
            if self.cost.seconds(load.with_chunk(start, mid)) <= self._target_s:
                low = mid
            else:
                high = mid - 1
        return low

    def observe(self, chunks: Sequence[ScheduledChunk], seconds: float) -> None:
        if chunks:
            self.cost.observe(StepLoad().with_chunks(chunks), seconds)

    def predicted_s(self, chunks: Sequence[ScheduledChunk]) -> float | None:
        return self.cost.seconds(StepLoad().with_chunks(chunks))


class WholePrompt(ChunkPolicy):
    """No chunking: the whole remainder or nothing. A remainder larger than the budget runs
    alone in an otherwise empty step (the prefill stall)."""

    def size(self, remaining: int, start: int, plan: StepPlan) -> int:
        return remaining if remaining <= plan.budget_left or plan.num_tokens == 0 else 0
