"""What to do with a request, given the predicted time to first token of its paths and its class's
objective (objectives.py):

    no objective for its class                        ADMIT   on the path placement chose
    its path's prediction within the objectives       ADMIT
    only the decode worker's own prefill within       LOCAL   the decode worker prefills it
    neither, a BATCH request deferred < defer_max_s   DEFER   it waits at the router, holding
                                                              nothing, and is judged again
    neither, a BATCH request deferred that long       ADMIT   (late work beats lost work)
    neither, VIP or NORMAL                            REFUSE  RESOURCE_EXHAUSTED, retry after
                                                              the predicted excess (at least
                                                              min_retry_after_s)

The time between tokens is the decode worker's recent step (a stream there gets a token per
step): over the class's TBT objective, no path is within the objectives. Judged once per request,
when it is first placed: a retry or a resume after a fault is never refused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pdserve.admission.objectives import Objective, Objectives
from pdserve.admission.ttft import TtftPrediction
from pdserve.requests import Priority


class Verdict(enum.Enum):
    ADMIT = "admit"
    LOCAL = "local"
    DEFER = "defer"
    REFUSE = "refuse"


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    reason: str  # "no_objective", "within", "local_within", "ttft", "tbt", "deferred_too_long"
    prediction: TtftPrediction | None  # of the path it takes (or the best one, refused or deferred)
    retry_after_s: float = 0.0  # REFUSE and DEFER: when judging again may find room


@dataclass(frozen=True)
class AdmissionPolicy:
    objectives: Objectives = Objectives()
    defer_max_s: float = 60.0  # a BATCH request waits at most this long at the router, then runs
    min_retry_after_s: float = 1.0

    def decide(self, priority: Priority, remote: TtftPrediction | None, local: TtftPrediction | None,
               decode_step_s: float, deferred_s: float = 0.0) -> Admission:
        """`remote`: the path placement chose (a prefill worker's, or the decode worker's own when
        it prefills anyway); `local`: the decode worker prefilling it instead (None: not an option)."""
        objective = self.objectives.of(priority)
        chosen = remote or local
        if not objective.any or chosen is None:
            return Admission(Verdict.ADMIT, "no_objective", chosen)
        tbt_missed = objective.tbt_s is not None and decode_step_s > objective.tbt_s
        if not tbt_missed:
            if _within(remote, objective):
                return Admission(Verdict.ADMIT, "within", remote)
            if local is not None and local is not remote and _within(local, objective):
                return Admission(Verdict.LOCAL, "local_within", local)
        best = min((p for p in (remote, local) if p is not None), key=lambda p: p.total_s)
        reason = "tbt" if tbt_missed else "ttft"
        retry_after = self._retry_after(best, objective, tbt_missed)
        if priority == Priority.BATCH:
            if deferred_s >= self.defer_max_s:
                return Admission(Verdict.ADMIT, "deferred_too_long", chosen)
            return Admission(Verdict.DEFER, reason, best, retry_after)
        return Admission(Verdict.REFUSE, reason, best, retry_after)

    def _retry_after(self, best: TtftPrediction, objective: Objective, tbt_missed: bool) -> float:
        """The predicted excess: how long the queues ahead take to shrink enough, if nothing joins them."""
        excess = 0.0 if tbt_missed or objective.ttft_s is None else best.total_s - objective.ttft_s
        return max(self.min_retry_after_s, excess)


def _within(prediction: TtftPrediction | None, objective: Objective) -> bool:
    return prediction is not None and (objective.ttft_s is None or prediction.total_s <= objective.ttft_s)
