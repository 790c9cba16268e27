"""What a step costs in seconds, predicted from what it computes: the model a time-sized chunk
policy (chunking.py `TimedChunks`) sizes prefill chunks by.

    seconds = fixed + decode_row * decode rows + prefill_token * prefill tokens
                    + context_pair * attention's query-key pairs

    a chunk of n tokens from position s:   pairs = n * s + n * (n + 1) / 2
                                           (each query attends to every position up to its own)
    a decode (n = 1) at position s:        pairs = s + 1 (its whole context)

The coefficients are measured on the machine at start (pdserve/engine/step_cost_probe.py) and
`StepCostModel` multiplies them by a correction learned from the steps observed since: observed
over predicted, averaged in log space, so the model follows the machine's load and what the
probe's passes leave out (scheduling, sampling). Pure Python, no tensors.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdserve.scheduler.output import ScheduledChunk


@dataclass(frozen=True, slots=True)
class StepLoad:
    """What a step computes, in the terms its cost is predicted from."""

    decode_rows: int = 0  # one-token chunks
    prefill_tokens: int = 0  # tokens of longer chunks
    context_pairs: int = 0  # attention's query-key pairs

    def with_chunk(self, start: int, num_tokens: int) -> StepLoad:
        pairs = num_tokens * start + num_tokens * (num_tokens + 1) // 2
        if num_tokens == 1:
            return StepLoad(self.decode_rows + 1, self.prefill_tokens, self.context_pairs + pairs)
        return StepLoad(self.decode_rows, self.prefill_tokens + num_tokens, self.context_pairs + pairs)

    def with_chunks(self, chunks: Iterable[ScheduledChunk]) -> StepLoad:
        rows, tokens, pairs = self.decode_rows, self.prefill_tokens, self.context_pairs
        for chunk in chunks:
            n = chunk.num_tokens
            pairs += n * chunk.start + n * (n + 1) // 2
            if n == 1:
                rows += 1
            else:
                tokens += n
        return StepLoad(rows, tokens, pairs)


@dataclass(frozen=True)
class StepCoefficients:
    """Seconds per unit of each term of a step's load, as measured on one machine."""

    fixed_s: float
    decode_row_s: float
    prefill_token_s: float
    context_pair_s: float

    def seconds(self, load: StepLoad) -> float:
        return (self.fixed_s + self.decode_row_s * load.decode_rows + self.prefill_token_s * load.prefill_tokens
                + self.context_pair_s * load.context_pairs)

    @classmethod
    def from_prefill_speed(cls, tokens_per_s: float) -> StepCoefficients:
        """A model from one figure (the calibration's prefill speed): every row one prompt token's time."""
        per_token = 1.0 / max(tokens_per_s, 1e-9)
        return cls(0.0, per_token, per_token, 0.0)

    def to_json(self) -> dict[str, Any]:
        return {"fixed_s": self.fixed_s, "decode_row_s": self.decode_row_s, "prefill_token_s": self.prefill_token_s,
                "context_pair_s": self.context_pair_s}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepCoefficients:
        return cls(data["fixed_s"], data["decode_row_s"], data["prefill_token_s"], data["context_pair_s"])


class StepCostModel:
    """The measured coefficients times a correction learned from observed steps: each observation
    moves the correction's logarithm `weight` of the way to log(observed / predicted), the ratio
    clamped to `bounds`. Read and fed by the scheduler's thread only."""

    def __init__(self, base: StepCoefficients, weight: float = 0.1, bounds: tuple[float, float] = (0.25, 4.0)):
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"weight must be within (0, 1], got {weight}")
        self.base = base
        self._weight = weight
        self._low, self._high = math.log(bounds[0]), math.log(bounds[1])
        self._log_correction = 0.0

    @property
    def correction(self) -> float:
        return math.exp(self._log_correction)

    def seconds(self, load: StepLoad) -> float:
        return self.base.seconds(load) * math.exp(self._log_correction)

    def observe(self, load: StepLoad, seconds: float) -> None:
        """A step of `load` took `seconds`."""
        predicted = self.base.seconds(load)
        if predicted <= 0.0 or seconds <= 0.0:
            return
        ratio = min(max(math.log(seconds / predicted), self._low), self._high)
        self._log_correction += self._weight * (ratio - self._log_correction)
