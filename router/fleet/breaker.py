"""Per-worker circuit breaker: a worker that keeps failing is taken out of rotation for a while.

    CLOSED --threshold consecutive failures--> OPEN --cooldown passed--> HALF_OPEN
       ^                                         ^                          | one trial (a health poll
       |                                         └──── it fails (cooldown x2, up to max) ┤  or a request)
       └──────────────────────────── it succeeds ───────────────────────────────────────┘

Failures are what the router charges to the worker (a call that found it gone, a health poll
that got no answer); successes are answered polls and finished requests. Time is passed in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    threshold: int = 3
    cooldown_s: float = 1.0
    max_cooldown_s: float = 10.0


@dataclass
class CircuitBreaker:
    config: BreakerConfig = BreakerConfig()
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0  # consecutive
    cooldown_s: float = 0.0
    reopen_at: float = 0.0
    trial_out: bool = False

    def allows(self, now: float) -> bool:
        """May a new request be placed on this worker now?"""
        if self.state == BreakerState.OPEN and now >= self.reopen_at:
            self.state, self.trial_out = BreakerState.HALF_OPEN, False
        if self.state == BreakerState.HALF_OPEN and not self.trial_out:
            return True
        return self.state == BreakerState.CLOSED

    def on_trial(self) -> None:
        """A request was placed while half-open: no other until it ends."""
        if self.state == BreakerState.HALF_OPEN:
            self.trial_out = True

    def on_success(self) -> None:
        self.state, self.failures, self.cooldown_s, self.trial_out = BreakerState.CLOSED, 0, 0.0, False

    def on_failure(self, now: float) -> bool:
        """Count one failure; True when this one opened the breaker."""
        self.failures += 1
        if self.state == BreakerState.HALF_OPEN or (self.state == BreakerState.CLOSED
                                                    and self.failures >= self.config.threshold):
            self._open(now)
            return True
        return False

    def _open(self, now: float) -> None:
        c = self.config
        self.cooldown_s = min(c.max_cooldown_s, self.cooldown_s * 2 if self.cooldown_s else c.cooldown_s)
        self.state, self.reopen_at, self.trial_out = BreakerState.OPEN, now + self.cooldown_s, False
