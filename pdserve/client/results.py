"""Streamed chunks into one Completion, with the client-side timings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pdserve.client.types import Chunk, Completion


def now() -> float:
    """The clock the timings are read on."""
    return time.perf_counter()


@dataclass
class Collector:
    started: float
    completion: Completion = field(default_factory=Completion)
    _last: float | None = None

    def add(self, chunk: Chunk, now: float) -> None:
        c, t = self.completion, self.completion.timings
        c.request_id = chunk.request_id
        if chunk.token_ids:
            if t.ttft_s is None:
                t.ttft_s = now - self.started
            elif self._last is not None:
                t.gaps_s.append(now - self._last)
            self._last = now
        c.token_ids.extend(chunk.token_ids)
        c.text += chunk.text
        c.logprobs.extend(chunk.logprobs)
        c.prompt_logprobs.extend(chunk.prompt_logprobs)
        if chunk.finish_reason is not None:
            c.finish_reason, c.usage = chunk.finish_reason, chunk.usage
        t.total_s = now - self.started
