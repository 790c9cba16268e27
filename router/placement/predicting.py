"""Predicting one request's time to first token on the paths open to it, from the workers' polled
figures (queued prompt tokens, measured prefill speed, step time) and what this router measured
(router/placement/observed.py); the arithmetic is pdserve/admission/ttft.py, the choice of prefill worker
router/placement/placement.py, the verdict pdserve/admission/policy.py.

A prefill worker's queue is what it reported at its last poll and what this router has sent it
since (`Worker.sent_tokens`): a burst arriving between two polls still sees the prompts ahead of
it, and a prompt half computed at the poll counts only its other half.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from pdserve.admission import PrefillSide, TtftPrediction, predict_ttft
from router.fleet.workers import Worker, WorkerPool
from router.flow.flow_types import FlowState, Job
from router.placement.observed import Observed
from router.placement.placement import NoWorker, choose_prefill

Probe = Callable[[str, tuple[int, ...], list[Worker]], Awaitable[dict[str, int]]]  # role, prompt, workers

DEFAULT_TOKENS_PER_S = 1000.0  # a speed for workers none of which has reported one (only orders them)


class Predictor:
    def __init__(self, pool: WorkerPool, observed: Observed, probe: Probe, late_reservation: bool = False):
        """`probe(role, prompt, workers)`: what each worker holds of the prompt (MatchPrefix);
        `late_reservation`: decode blocks are reserved once a prefill worker started the prompt (on
        one that takes that), so the reservation overlaps its prefill."""
        self.pool = pool
        self.observed = observed
        self.probe = probe
        self.late_reservation = late_reservation

    def reserve_s(self, decode: Worker) -> float:
        """Until `decode` reserves blocks: its next step when it has room and nothing waits there,
        else as long as its reservations took lately (at least a step)."""
        if decode.waiting == 0 and decode.free_blocks > 0:
            return decode.step_s
        return max(decode.step_s, self.observed.reserve_s(decode.address))

    def local(self, job: Job, state: FlowState, decode: Worker, cached: int) -> TtftPrediction:
        """The decode worker prefilling the prompt (and the tokens so far) itself."""
        side = PrefillSide(decode.address, decode.queued_prefill_tokens, decode.prefill_tokens_per_s, cached)
        return predict_ttft(_length(job, state), side, self.reserve_s(decode), self.fallback_tokens_per_s())

    async def remote(self, job: Job, state: FlowState, decode: Worker) -> tuple[Worker, TtftPrediction]:
        """The prefill worker pairing with `decode` with the earliest predicted first token
        (probing what each holds of the prompt), and that prediction. Raises NoWorker when none is
        usable."""
        workers = self.pool.of_role("prefill", decode)
        avoid = state.avoided("prefill", workers)
        probed = [w for w in workers if w.address not in avoid]
        cached = await self.probe("prefill", (*job.prompt, *state.generated), probed)
        predictions = self._remote(job, state, decode, workers, cached)
        chosen = choose_prefill(workers, cached, avoid, {a: p.total_s for a, p in predictions.items()})
        return chosen, predictions[chosen.address]

    def _remote(self, job: Job, state: FlowState, decode: Worker, workers: list[Worker],
                cached: Mapping[str, int]) -> dict[str, TtftPrediction]:
        if not workers:
            raise NoWorker("no prefill worker is ready")
        reserve_s, length, fallback = self.reserve_s(decode), _length(job, state), self.fallback_tokens_per_s()
        return {w.address: predict_ttft(length, self.side(w, cached.get(w.address, 0)), reserve_s, fallback,
                                        overlapped=self.late_reservation and w.target_follows)
                for w in workers}

    def on(self, job: Job, state: FlowState, worker: Worker) -> TtftPrediction:
        """The prompt's queue and prefill on `worker` (nothing of it cached, no reservation to wait for)."""
        return predict_ttft(_length(job, state), self.side(worker, 0), 0.0, self.fallback_tokens_per_s())

    def side(self, worker: Worker, cached: int) -> PrefillSide:
        return PrefillSide(worker.address, worker.queued_prefill_tokens + worker.sent_tokens,
                           worker.prefill_tokens_per_s, cached, self.observed.tail_s(worker.address))

    def fallback_tokens_per_s(self) -> float:
        """The mean measured speed of the workers that reported one (a worker that has not is
        predicted as an average one)."""
        known = [w.prefill_tokens_per_s for w in self.pool.workers.values() if w.prefill_tokens_per_s > 0]
        return sum(known) / len(known) if known else DEFAULT_TOKENS_PER_S


def _length(job: Job, state: FlowState) -> int:
    return len(job.prompt) + len(state.generated)
