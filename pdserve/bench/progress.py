"""A one-line text progress bar on stderr: done/total, failures, elapsed time."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO


@dataclass
class Progress:
    """`update()` redraws in place on a terminal; elsewhere it prints a line every `every_s` seconds."""

    total: int
    label: str = "bench"
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    width: int = 30
    every_s: float = 10.0
    enabled: bool = True
    _last: float = 0.0

    def line(self, done: int, failed: int, elapsed_s: float) -> str:
        filled = self.width * done // max(1, self.total)
        bar = "#" * filled + "." * (self.width - filled)
        return f"{self.label} [{bar}] {done}/{self.total} done, {failed} failed, {elapsed_s:5.0f} s"

    def update(self, done: int, failed: int, elapsed_s: float, final: bool = False) -> None:
        if not self.enabled:
            return
        tty = self.stream.isatty()
        now = time.monotonic()
        if not (tty or final or now - self._last >= self.every_s):
            return
        self._last = now
        end = "\n" if final or not tty else ""
        self.stream.write(("\r" if tty else "") + self.line(done, failed, elapsed_s) + end)
        self.stream.flush()
