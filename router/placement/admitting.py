"""Admission at a request's first placement: the predicted time to first token of the path
placement chose and of the decode worker prefilling it instead (router/placement/predicting.py), judged
against its class's objectives (pdserve/admission/policy.py).

    Plan.local      where the prompt is computed: placement's decision, or the decode worker when
                    only that path is within the objective (reason "objective")
    Plan.prefill    the prefill worker a remote prefill goes to (the earliest predicted first token)
    Plan.admission  the verdict and the prediction it rests on (exported with the measured TTFT)

A retry or a resume after a fault is never refused or deferred: its prediction is still made, for
the prefill worker's choice.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from pdserve.admission import Admission, AdmissionPolicy, TtftPrediction, Verdict
from pdserve.errors import OverloadedError
from router.fleet.workers import Worker
from router.flow.flow_types import FlowState, Job
from router.placement.local_prefill import LocalPrefillDecision, LocalPrefillPolicy
from router.placement.placement import NoWorker
from router.placement.predicting import Predictor

BY_OBJECTIVE = LocalPrefillDecision(True, "objective")  # only the decode worker's own prefill is within it


@dataclass(frozen=True)
class Plan:
    local: LocalPrefillDecision
    prefill: Worker | None  # None: the decode worker prefills, or no prefill worker is usable now
    admission: Admission


class Admitter:
    def __init__(self, predictor: Predictor, policy: AdmissionPolicy, local_policy: LocalPrefillPolicy):
        self.predictor = predictor
        self.policy = policy
        self.local_policy = local_policy

    async def judge(self, job: Job, state: FlowState, decode: Worker, cached: int, decision: LocalPrefillDecision,
                    deferred_s: float = 0.0) -> Plan:
        """`decode` and `cached`: placement's decode worker and what it holds of the prompt;
        `decision`: whether it prefills itself; `deferred_s`: how long the request has been deferred."""
        local = self.predictor.local(job, state, decode, cached)
        prefill: Worker | None = None
        chosen: TtftPrediction | None = local
        if not decision.local:
            try:
                prefill, chosen = await self.predictor.remote(job, state, decode)
            except NoWorker:
                chosen = None
        if state.protocol.attempts > 0 or state.generated:
            return Plan(decision, prefill, Admission(Verdict.ADMIT, "retry", chosen))
        alternative = local if not decision.local and self._may_prefill_locally(job, state, cached) else None
        admission = self.policy.decide(job.priority, chosen, alternative, decode.step_s, deferred_s)
        if admission.verdict is Verdict.LOCAL:
            return Plan(BY_OBJECTIVE, None, admission)
        return Plan(decision, prefill, admission)

    def _may_prefill_locally(self, job: Job, state: FlowState, cached: int) -> bool:
        """Within what a decode worker may compute of a prompt (router/placement/local_prefill.py)."""
        uncached = len(job.prompt) + len(state.generated) - cached
        return 0 < self.local_policy.max_uncached_tokens and uncached <= self.local_policy.max_uncached_tokens


DEFER_POLL_S = 1.0  # a deferred request is judged again at least this often


def admission_attributes(admission: Admission) -> dict:
    """The verdict and its prediction, for the request's trace."""
    attrs = {"pdserve.admission": admission.verdict.value, "pdserve.admission.reason": admission.reason}
    if admission.prediction is not None:
        attrs.update(admission.prediction.attributes())
    if admission.verdict in (Verdict.REFUSE, Verdict.DEFER):
        attrs["pdserve.admission.retry_after_s"] = admission.retry_after_s
    return attrs


async def defer(job: Job, retry_after_s: float) -> None:
    """Wait before judging a deferred request again; past its deadline it ends (DEADLINE_EXCEEDED)."""
    pause = min(DEFER_POLL_S, retry_after_s)
    if job.deadline is not None and time.monotonic() + pause >= job.deadline:
        raise TimeoutError(f"request {job.request_id} was deferred (its class's objective cannot be met now) "
                           f"until its deadline")
    await asyncio.sleep(pause)


def refusal(job: Job, admission: Admission, ttft_objective_s: float | None) -> OverloadedError:
    p = admission.prediction
    if admission.reason == "tbt":
        why = "every decode worker's time between tokens is over the objective of its class"
    else:
        assert p is not None
        why = (f"its first token is predicted in {p.total_s:.2f} s (reserve {p.reserve_s:.2f}, queue {p.queue_s:.2f}, "
               f"prefill {p.prefill_s:.2f}, transfer {p.transfer_s:.2f}), over the {ttft_objective_s} s "
               f"objective of its class")
    return OverloadedError(f"{job.priority.name.lower()} request {job.request_id} refused: {why}; retry after "
                           f"{admission.retry_after_s:.1f} s", admission.retry_after_s)
