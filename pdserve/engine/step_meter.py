"""How fast this engine has been stepping lately: what a router predicts time to first token from
(pdserve/admission/ttft.py), measured on the machine the worker runs on.

    prefill_tokens_per_s   prompt tokens computed per second of the steps that computed them
                           (a step's decodes are charged to it too: a mixed step's prompt tokens
                           come no faster than that); the start-up calibration until one ran
    step_s                 the seconds of a step that computed tokens (a decode worker's time
                           between tokens)

Both are moving averages whose weight halves every `half_life_s` of stepping, so a rate follows
the load of the last few seconds, not of one step. Fed by the engine thread after each step,
read by anyone (two floats: a reader sees one step's figures or the next's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

@dataclass(frozen=True)
class StepRates:
    prefill_tokens_per_s: float
    step_s: float  # 0.0 until a step computed tokens


class StepMeter:
    def __init__(self, prefill_tokens_per_s: float, half_life_s: float = 2.0):
        if half_life_s <= 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
        self._half_life_s = half_life_s
        self._prefill_tokens_per_s = prefill_tokens_per_s
        self._step_s = 0.0

    @property
    def rates(self) -> StepRates:
        return StepRates(self._prefill_tokens_per_s, self._step_s)

    def record(self, num_tokens: int, num_chunks: int, seconds: float) -> None:
        """One step that ran `num_tokens` tokens in `num_chunks` chunks through the model in
        `seconds`. Its prompt tokens are those beyond one per chunk (a decode is one token): at
        most one short per prefill chunk, and nothing here walks the step's chunks."""
        if not num_chunks or seconds <= 0:
            return
        prefill = num_tokens - num_chunks
        self._step_s = self._blend(self._step_s, seconds, seconds) if self._step_s else seconds
        if prefill > 0:
            self._prefill_tokens_per_s = self._blend(self._prefill_tokens_per_s, prefill / seconds, seconds)

    def _blend(self, old: float, new: float, seconds: float) -> float:
        """A step of `seconds` weighs as much as that time's share of a half-life."""
        kept = math.exp(-math.log(2.0) * seconds / self._half_life_s)
        return kept * old + (1.0 - kept) * new
