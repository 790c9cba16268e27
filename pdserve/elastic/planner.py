"""When an elastic worker should change role, from the fleet's signals (signals.py):

    to prefill   the prefill workers' backlog >= backlog_high_s (seconds of queued prompt tokens at
                 their measured speed) while the decode side can spare a worker: nothing waiting
                 there, and with one decode worker fewer (its load spread over the others: KV
                 occupancy and step time x n/(n-1), steps taken to grow with the batch) occupancy
                 <= occupancy_low and steps within the TBT objective; the elastic decode worker
                 running fewest requests moves (it has least to finish)
    to decode    the decode side is pressed: requests waiting there, occupancy >= occupancy_high, or
                 steps over the TBT objective; while the prefill backlog <= backlog_low_s; the elastic
                 prefill worker with the smallest queue moves

Hysteresis: a condition must hold at `confirm` consecutive observations (counted afresh after
each change), nothing changes while a change is under way, no change undoes the last one within
`cooldown_s` of it (one in the same direction may follow: a burst can take several workers),
and neither role is ever left without a worker. Each change comes with its reason (the figures
it rests on), for the log line, the metric and the span event the router makes of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pdserve.elastic.signals import FleetSignals, WorkerSignals


@dataclass(frozen=True)
class RoleChange:
    address: str
    from_role: str
    to_role: str
    reason: str  # "prefill_backlog" | "decode_waiting" | "decode_occupancy" | "decode_tbt"
    figures: dict[str, float]  # what the decision rests on

    def describe(self) -> str:
        shown = ", ".join(f"{k} {v:.3g}" for k, v in self.figures.items())
        return f"{self.address} from {self.from_role} to {self.to_role} ({self.reason}: {shown})"


@dataclass
class PlannerPolicy:
    backlog_high_s: float = 2.0
    backlog_low_s: float = 0.5
    occupancy_low: float = 0.5
    occupancy_high: float = 0.85
    tbt_objective_s: float | None = None
    confirm: int = 3
    cooldown_s: float = 15.0
    _streak: dict[str, int] = field(default_factory=dict)
    _last_change: float = -math.inf
    _last_direction: str | None = None

    def observe(self, signals: FleetSignals, now: float) -> RoleChange | None:
        """One observation; the change to make now, if any."""
        wanted = self._wanted(signals)
        for direction in ("prefill", "decode"):
            self._streak[direction] = self._streak.get(direction, 0) + 1 if wanted and wanted[0] == direction else 0
        if wanted is None or signals.changing or self._streak[wanted[0]] < self.confirm:
            return None
        if wanted[0] != self._last_direction and now - self._last_change < self.cooldown_s:
            return None  # it would undo the last change
        change = self._pick(signals, *wanted)
        if change is not None:
            self._last_change, self._last_direction, self._streak = now, wanted[0], {}
        return change

    def _wanted(self, s: FleetSignals) -> tuple[str, str, dict[str, float]] | None:
        backlog, waiting, occupancy, step = s.prefill_backlog_s, s.decode_waiting, s.decode_occupancy, s.decode_step_s
        figures = {"prefill_backlog_s": backlog, "decode_waiting": waiting, "decode_occupancy": occupancy,
                   "decode_step_s": step}
        tbt_over = self.tbt_objective_s is not None and step > self.tbt_objective_s
        if backlog >= self.backlog_high_s and waiting == 0 and self._spare_decode(s):
            return "prefill", "prefill_backlog", figures
        if backlog <= self.backlog_low_s:
            if waiting > 0:
                return "decode", "decode_waiting", figures
            if occupancy >= self.occupancy_high:
                return "decode", "decode_occupancy", figures
            if tbt_over:
                return "decode", "decode_tbt", figures
        return None

    def _spare_decode(self, s: FleetSignals) -> bool:
        """The decode workers but one would carry their load within the low occupancy mark and
        the TBT objective (their steps taken to grow in proportion to the batch)."""
        n = len(s.of_role("decode"))
        if n < 2:
            return False
        grown = n / (n - 1)
        return (s.decode_occupancy * grown <= self.occupancy_low
                and (self.tbt_objective_s is None or s.decode_step_s * grown <= self.tbt_objective_s))

    @staticmethod
    def _pick(s: FleetSignals, to_role: str, reason: str, figures: dict[str, float]) -> RoleChange | None:
        from_role = "decode" if to_role == "prefill" else "prefill"
        pool = s.of_role(from_role)
        movable = [w for w in pool if w.elastic]
        if len(pool) < 2 or not movable:
            return None  # never leave a role without a worker; only an elastic worker moves
        key = (lambda w: w.running + w.waiting) if from_role == "decode" else (lambda w: w.queued_prefill_tokens)
        chosen: WorkerSignals = min(movable, key=key)
        return RoleChange(chosen.address, from_role, to_role, reason, figures)
