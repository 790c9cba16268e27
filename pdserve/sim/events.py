"""A discrete-event loop: actions run in time order (ties in scheduling order) on one clock."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class EventLoop:
    """Also the simulated clock: calling it returns the current time in seconds."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.now

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run `action` at `when` (never in the past: earlier times run now)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), action))

    def pending(self) -> int:
        """Actions still to run."""
        return len(self._heap)

    def run(self) -> None:
        while self._heap:
            self.now, _, action = heapq.heappop(self._heap)
            action()
