"""Rank 0 watching its followers between steps too: an idle worker whose rank was lost learns
of it at once, not at its next request."""

from __future__ import annotations

import threading
from collections.abc import Callable

from pdserve.parallel.ranks import RankFailed, RankGroup


class RankWatch:
    """Polls `ranks.gone()` every `ranks.config.watch_s` (the interval the worker's ranks were
    started with) on its own thread; the first loss calls `on_lost(RankFailed)` (from that
    thread) once, and the watch ends."""

    def __init__(self, ranks: RankGroup, on_lost: Callable[[RankFailed], None]):
        self._ranks, self._interval_s, self._on_lost = ranks, ranks.config.watch_s, on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rank-watch", daemon=True)

    def start(self) -> "RankWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            if gone := self._ranks.gone():
                if not self._stop.is_set():
                    self._on_lost(RankFailed(f"tensor-parallel rank lost: {'; '.join(gone)}"))
                return
