"""The scheduler: requests in, one SchedulerOutput per step out. Never touches tensors.

    engine loop:  output = scheduler.schedule()
                  sampled = executor.execute(output)          # see output.py for the contract
                  finished = scheduler.update(output, sampled)

Subclasses (policies.py) only compose `schedule()` from the steps in steps.py. Every mutation
comes from one thread, between steps. Time comes only from the injected clock.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable, Mapping

from pdserve.config import SchedulerConfig
from pdserve.kv.manager import BlockHold, KVManager
from pdserve.requests import FinishReason, Request, RequestState
from pdserve.scheduler.errors import DuplicateRequestError, NotReceivingError, PromptTooLongError, QueueFullError
from pdserve.scheduler.finished_kv import FinishedKV, HoldAll, HoldFinished
from pdserve.scheduler.held import Blocked
from pdserve.scheduler.output import SchedulerOutput
from pdserve.scheduler.queue import Group
from pdserve.scheduler.plan import StepPlan
from pdserve.scheduler.results import Reservation, SchedulerStats
from pdserve.scheduler.state import Queues
from pdserve.scheduler.steps import Steps
from pdserve.scheduler.stopping import StopRule

_RUNNING = RequestState.RUNNING


_SENT = HoldFinished()  # a request whose KV is sent on: its blocks outlive it until the send ends


class Scheduler(abc.ABC):
    def __init__(self, cfg: SchedulerConfig, kv: KVManager, queues: Queues, steps: Steps,
                 finished_kv: FinishedKV, max_model_len: int, clock: Callable[[], float]):
        self.cfg = cfg
        self.kv = kv
        self.max_model_len = max_model_len
        self._q = queues
        self._steps = steps
        self._finished_kv = finished_kv
        self._quarantine = HoldAll()
        self._clock = clock
        self._finished: list[Request] = []
        self._reserved: list[Reservation] = []
        self._holds: dict[str, BlockHold] = {}
        self._stops: dict[str, StopRule] = {}  # every live request's, built once at add

    @abc.abstractmethod
    def schedule(self) -> SchedulerOutput:
        """Decide the next step. See output.py for what the executor must do with it."""

    def _begin_step(self) -> StepPlan:
        return StepPlan(self.cfg.token_budget, self._clock())

    def _end_step(self, plan: StepPlan) -> SchedulerOutput:
        self._reserved.extend(plan.reserved)
        finished, self._finished = tuple(self._finished), []
        return plan.output(finished)

    # ---- requests in ----

    def add(self, request: Request) -> None:
        """Queue a new request (assigns arrival_seq). Raises QueueFullError, DuplicateRequestError,
        PromptTooLongError; nothing changes when it raises."""
        self._validate(request, request.num_tokens)
        self._q.add(request, self._clock(), remote=False)
        self._stops[request.request_id] = StopRule.of(request, self.max_model_len)

    def add_remote(self, request: Request, kv_tokens: int | None = None) -> None:
        """Queue a request whose KV comes from a prefill worker: for its first `kv_tokens` tokens
        (default its prompt; a resume's: prompt and the tokens generated so far), and the token
        after them with mark_received unless it is already in output_token_ids. Once admitted its
        blocks are listed by take_reserved() and it waits, unpreemptible, for mark_received()."""
        kv_tokens = request.num_prompt_tokens if kv_tokens is None else kv_tokens
        assert request.num_prompt_tokens <= kv_tokens <= request.num_tokens, f"{request.request_id}: KV of {kv_tokens}"
        self._validate(request, kv_tokens + 1)
        request.num_remote_outputs = kv_tokens - request.num_prompt_tokens
        self._q.add(request, self._clock(), remote=True)
        self._stops[request.request_id] = StopRule.of(request, self.max_model_len)

    def _validate(self, request: Request, num_tokens: int) -> None:
        if request.request_id in self._q.requests:
            raise DuplicateRequestError(f"request {request.request_id!r} is already live")
        if len(self._q.waiting) >= self.cfg.max_waiting:
            raise QueueFullError(f"{len(self._q.waiting)} requests are waiting (max_waiting)")
        if not request.prompt_token_ids or num_tokens >= self.max_model_len:
            raise PromptTooLongError(f"{num_tokens} tokens leave no room below {self.max_model_len}")

    def mark_received(self, request_id: str, first_token: int | None = None) -> Request:
        """The remote KV of a reserved request has arrived (with its first token, unless that
        came with add_remote): it becomes a running decode, or finishes at once if that token
        already ends it."""
        request = self._q.receiving.get(request_id)
        if request is None:
            raise NotReceivingError(request_id)
        if first_token is not None:
            request.output_token_ids.append(first_token)
        assert request.num_tokens == request.num_remote_tokens + 1, f"{request_id}: no first token"
        request.num_computed_tokens = request.num_remote_tokens
        self._q.received(request)
        self.kv.cache_computed(request)
        reason = self._stops[request_id].reason(request)
        if reason is not None:
            self._finish(request, reason)
            self._finished.append(request)
        return request

    # ---- a step's results ----

    def observe(self, output: SchedulerOutput, seconds: float) -> None:
        """The step of `output` took `seconds`, scheduling to tokens: what a chunk policy sized by
        time learns its cost model from (others ignore it)."""
        self._steps.observe(output.chunks, seconds)

    def predicted_step_s(self, output: SchedulerOutput) -> float | None:
        """The seconds the chunk policy predicts the step of `output` takes (None: it predicts none)."""
        return self._steps.predicted_s(output.chunks)

    def update(self, output: SchedulerOutput, sampled: Mapping[str, int]) -> list[Request]:
        """Advance every chunk, append sampled tokens, finish requests that are done (their
        blocks go to the prefix cache, or into a hold). Returns the newly finished.
        A request that ended after schedule() is skipped.
        NOTE: the hot loop of a step's results. Newly complete blocks are cached in chunk order,
        as one KV call for each run of chunks between finishes."""
        finished: list[Request] = []
        advanced: list[Request] = []  # since the last finish: their full blocks go to the cache
        stops = self._stops
        for chunk in output.chunks:
            request, num_tokens, samples = chunk.request, chunk.num_tokens, chunk.samples
            if request.state is not _RUNNING:
                continue
            request.num_computed_tokens = chunk.start + num_tokens
            if samples:
                rid, output_ids = request.request_id, request.output_token_ids
                output_ids.append(token := sampled[rid])
                stop = stops[rid]
                if token in stop.stop_ids or len(output_ids) >= stop.max_output:
                    self.kv.cache_all_computed(advanced)
                    advanced = []
                    self._stop(request, stop)
                    finished.append(request)
                    continue
            if num_tokens != 1 or not samples:
                self._q.progressed(request)
            advanced.append(request)
        self.kv.cache_all_computed(advanced)
        self.kv.end_step()
        return finished

    def _stop(self, request: Request, stop: StopRule) -> None:
        reason = stop.reason(request)
        assert reason is not None, f"{request.request_id}: not done"
        self._finish(request, reason)

    def _finish(self, request: Request, reason: FinishReason) -> None:
        request.finish_reason = reason
        receiving = request.request_id in self._q.receiving
        settle = self._quarantine if receiving else _SENT if request.sends_kv else self._finished_kv
        hold = settle.settle(self.kv, request)
        if hold is not None:
            self._holds[request.request_id] = hold
        self._q.remove(request)
        del self._stops[request.request_id]

    # ---- engine-level control ----

    def finish(self, request_id: str, reason: FinishReason) -> Request | None:
        """End a live request for a reason found above the token level (a stop string)."""
        request = self._q.requests.get(request_id)
        if request is not None:
            self._finish(request, reason)
            self._finished.append(request)
        return request

    def abort(self, request_id: str) -> Request | None:
        """End a live request in any state; its blocks, device and host, are freed.
        NOTE: blocks a transfer may still touch are held instead (see take_holds) until
        release_hold: those of a request receiving remote KV, and on a scheduler built with
        hold_finished (prefill workers) every device block."""
        request = self._q.requests.get(request_id)
        if request is not None:
            self._finish(request, FinishReason.ABORT)
            self._finished.append(request)
        return request

    def detach(self, request_id: str) -> BlockHold | None:
        """A decoding request leaves this scheduler with its KV: a hold on every block of its
        computed tokens (every token but the last sampled one), then it ends as aborted. None,
        and nothing changed, unless it is running with all but its last token computed (queued,
        prefilling, preempted, swapped out or receiving: its KV is not all on the device)."""
        request = self._q.requests.get(request_id)
        if request is None or request.state != RequestState.RUNNING or request_id in self._q.receiving \
                or not request.output_token_ids or request.num_computed_tokens != request.num_tokens - 1:
            return None
        hold = self.kv.hold(request)
        self._finish(request, FinishReason.ABORT)  # not among the step's finished: it did not end, it left
        return hold

    def take_reserved(self) -> list[Reservation]:
        """Remote requests whose blocks were allocated since the last call."""
        reserved, self._reserved = self._reserved, []
        return reserved

    def take_holds(self) -> dict[str, BlockHold]:
        """Holds taken by the scheduler since the last call: finished requests of a scheduler
        built with hold_finished, and ended requests that were still receiving KV."""
        holds, self._holds = self._holds, {}
        return holds

    def hold(self, request_id: str) -> BlockHold | None:
        """Hold the device blocks a live request has now (e.g. while a transfer reads the
        chunks just computed); None if it has none."""
        request = self._q.requests.get(request_id)
        if request is None or not self.kv.has_blocks(request_id):
            return None
        return self.kv.hold(request)

    def release_hold(self, hold: BlockHold) -> None:
        """The transfer touching these blocks is over: give them back. Idempotent."""
        self.kv.release(hold)

    def quarantine(self, hold: BlockHold, blocks: tuple[int, ...]) -> BlockHold:
        """Keep only `blocks` of a hold out of use (a withdrawn receive may still write them);
        the rest come back now. Release the returned hold once nothing can touch them."""
        return self.kv.quarantine(hold, blocks)

    # ---- inspection ----

    def get(self, request_id: str) -> Request | None:
        return self._q.requests.get(request_id)

    def has_work(self) -> bool:
        """True while schedule() can produce work (requests receiving KV do not count), or has
        requests that ended between steps to report (a first token that already ends a request)."""
        return bool(self._q.running or len(self._q.waiting) or len(self._q.swapped) or self._finished)

    def stats(self) -> SchedulerStats:
        q = self._q
        reserved = sum(len(self.kv.block_table(rid)) for rid in q.receiving)
        return SchedulerStats(len(q.running), len(q.waiting), len(q.swapped), self.kv.stats(), len(q.receiving),
                              reserved)

    def blocked_head(self) -> Blocked | None:
        """The best prefill, running or queued, when the blocks it needs to compute the rest of its
        prompt (past its cached prefix; a queued one keeping the watermark) exceed those available
        now; None when there is none or it fits. Read-only: a prefill worker asks it between
        decisions (AsyncEngine.query)."""
        now = self._clock()
        running = [self._q.running_prefill(r, now) for r in self._q.prefilling.values()]
        head = min((*running, *itertools.islice(self._q.waiting.candidates(now), 1)), default=None)
        if head is None:
            return None
        request = head.request
        if head.group == Group.RUNNING:
            need = self.kv.num_new_blocks(request, request.num_tokens - request.num_computed_tokens)
        else:
            match = self.kv.match(request)
            need = self.kv.admission_cost(match, request.num_tokens - match.num_tokens) + self.kv.watermark_blocks
        short = need - self.kv.num_available
        return Blocked(request.priority, short) if short > 0 else None

    def queued_prefill_tokens(self) -> int:
        """Tokens this worker still computes before the requests it holds are decoding: what is
        uncomputed of those waiting (a recompute victim's whole context) and of running prefills.
        Not those whose KV a prefill worker sends, nor swapped ones (copied back, not computed).
        A sum over the queue: for Stats, never called in a step."""
        return self._q.queued_prefill_tokens()

    def check_integrity(self) -> None:
        """Assert block accounting (free + cached + active == total, refcounts match the block
        tables and holds) and that every request sits in exactly one consistent place."""
        self.kv.check_integrity()
        self._q.check_integrity(self.kv)
