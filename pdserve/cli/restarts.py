"""When to restart a child process that exited: exponential backoff, forgiven after a good run.

    exits in a row:   1     2    3    4    5    6 ...
    delay (s):        0.5   1    2    4    8    10 (the cap) ...

A child that stayed up for `reset_after_s` before it exited starts again at the first delay.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Restart:
    delay_s: float
    streak: int  # exits in a row, none after a run of reset_after_s or longer


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 0.5
    factor: float = 2.0
    max_delay_s: float = 10.0
    reset_after_s: float = 30.0

    def after_exit(self, streak: int, uptime_s: float) -> Restart:
        """`streak`: the child's exits in a row before this one; `uptime_s`: how long it ran."""
        streak = 1 if uptime_s >= self.reset_after_s else streak + 1
        delay = min(self.max_delay_s, self.first_delay_s * self.factor ** (streak - 1))
        return Restart(delay, streak)
