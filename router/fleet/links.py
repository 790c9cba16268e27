"""Per-pair circuit breakers on the KV links: a prefill worker that cannot deliver KV to a decode
worker (the transport found the peer unreachable, or a send to it failed) opens that pair's
breaker, not the decode worker's: the decode worker may be fine for the router and for every
other prefill worker, and can prefill for itself.

    a remote prefill on (P, D) failed through D  -> Links.failed(P, D): the pair is out (1 s,
                                                    doubling to 30 s), then one trial request
    a remote prefill on (P, D) delivered         -> Links.delivered(P, D): the pair is in

While a pair is out, placement takes another prefill worker for D, or D prefills itself when no
prefill worker pairs with it (router/placement/placing.py). Time is passed in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from router.fleet.breaker import BreakerConfig, BreakerState, CircuitBreaker

log = logging.getLogger(__name__)

LINK_BREAKER = BreakerConfig(threshold=1, cooldown_s=1.0, max_cooldown_s=30.0)


@dataclass
class Links:
    config: BreakerConfig = LINK_BREAKER
    _breakers: dict[tuple[str, str], CircuitBreaker] = field(default_factory=dict)

    def allows(self, prefill: str, decode: str, now: float) -> bool:
        breaker = self._breakers.get((prefill, decode))
        return breaker is None or breaker.allows(now)

    def trial(self, prefill: str, decode: str) -> None:
        """A request goes over the pair: while half-open, no other until it ends."""
        breaker = self._breakers.get((prefill, decode))
        if breaker is not None:
            breaker.on_trial()

    def failed(self, prefill: str, decode: str, now: float, why: str) -> bool:
        """KV from `prefill` did not reach `decode`; True when this opened the pair's breaker."""
        breaker = self._breakers.setdefault((prefill, decode), CircuitBreaker(self.config))
        opened = breaker.on_failure(now)
        if opened:
            log.warning("KV link %s -> %s out of rotation for %.1f s: %s", prefill, decode, breaker.cooldown_s, why)
        return opened

    def delivered(self, prefill: str, decode: str) -> bool:
        """KV from `prefill` reached `decode`; True when this closed the pair's breaker."""
        breaker = self._breakers.pop((prefill, decode), None)
        if breaker is not None and breaker.state != BreakerState.CLOSED:
            log.info("KV link %s -> %s back in rotation", prefill, decode)
            return True
        return False

    def out(self, now: float) -> list[tuple[str, str]]:
        """The pairs whose breaker keeps them out now."""
        return [pair for pair, breaker in self._breakers.items()
                if breaker.state == BreakerState.OPEN and now < breaker.reopen_at]
