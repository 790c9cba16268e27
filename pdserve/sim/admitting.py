"""The router's admission in the simulator: the same policy (pdserve/admission) over the
simulated instances' figures, judged once per request when it first arrives.

    reserve_s   the decode instance's last step when it has room for the prompt and nothing
                waits there; else how long reservations took lately (measured here, as the
                router measures them)
    remote      each prefill instance: its queued prompt tokens and what it holds of this
                prompt, at its prefill speed, plus its link's time for one chunk's KV; the earliest
    local       the decode instance computing the prompt itself, behind its own queue

ADMIT and LOCAL place the request (on a prefill instance, or on the decode instance alone);
DEFER judges it again after the predicted excess; REFUSE fails it (the client would retry).
A request placed again after a role change is not judged again.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.admission import Admission, AdmissionPolicy, PrefillSide, TtftPrediction, predict_ttft
from pdserve.requests import Request
from pdserve.sim.hardware import Link
from pdserve.sim.instance import Instance

RECENT = 0.2  # weight of the newest reservation wait in the running estimate


@dataclass
class ReservationWaits:
    """How long decode reservations took lately (an exponentially weighted mean)."""

    mean_s: float = 0.0

    def add(self, waited_s: float) -> None:
        self.mean_s += RECENT * (waited_s - self.mean_s)


class SimAdmission:
    def __init__(self, policy: AdmissionPolicy, max_chunk_tokens: int, link: Link):
        self.policy = policy
        self.waits = ReservationWaits()
        self._chunk, self._link = max_chunk_tokens, link

    def judge(self, request: Request, decode: Instance, prefill: list[Instance], room_tokens: int,
              deferred_s: float) -> Admission:
        """`room_tokens`: what the decode instance has free beyond the prompts queued for it."""
        prompt = request.prompt_token_ids
        waiting = decode.scheduler.stats().waiting
        reserve_s = decode.last_step_s if room_tokens >= len(prompt) and not waiting else self.waits.mean_s
        remote = min((self._remote(prompt, p, reserve_s) for p in prefill), key=lambda t: t.total_s, default=None)
        local = predict_ttft(len(prompt), PrefillSide(decode.name, decode.scheduler.queued_prefill_tokens(),
                                                      decode.prefill_tokens_per_s, decode.scheduler.kv.probe(prompt)),
                             0.0, decode.prefill_tokens_per_s)
        return self.policy.decide(request.priority, remote, local, decode.last_step_s, deferred_s)

    def _remote(self, prompt: list[int], prefill: Instance, reserve_s: float) -> TtftPrediction:
        piece = prefill.model.kv_transfer_time(min(len(prompt), self._chunk), self._link)
        side = PrefillSide(prefill.name, prefill.scheduler.queued_prefill_tokens(), prefill.prefill_tokens_per_s,
                           prefill.scheduler.kv.probe(prompt), piece)
        return predict_ttft(len(prompt), side, reserve_s, prefill.prefill_tokens_per_s)
