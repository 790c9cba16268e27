"""What one step has decided so far; turned into the SchedulerOutput at the end of the step."""

from __future__ import annotations

from collections.abc import Sequence

from operator import attrgetter

from pdserve.requests import Request
from pdserve.scheduler.output import Preemption, SchedulerOutput, ScheduledChunk, decode_chunks, make_chunk
from pdserve.scheduler.results import Reservation
from pdserve.scheduler.step_cost import StepLoad

_request_id = attrgetter("request_id")


class StepPlan:
    def __init__(self, token_budget: int, now: float):
        self.now = now
        self.budget_left = token_budget
        self.num_tokens = 0
        self.chunks: list[ScheduledChunk] = []
        self.touched: set[str] = set()  # scheduled, resumed or preempted this step: never a victim
        self.preempted: list[Preemption] = []
        self.swap_out: list[tuple[int, int]] = []
        self.swap_in: list[tuple[int, int]] = []
        self.resumed: list[Request] = []
        self.reserved: list[Reservation] = []
        self.prefilling: list | None = None  # running prefill candidates, found once per step
        self.growth_reserve = 0  # blocks kept for decodes scheduled after admissions
        self._load = StepLoad()  # of chunks[:_loaded], summed only when a policy asks (load())
        self._loaded = 0

    def add_chunk(self, request: Request, num_tokens: int, block_table: tuple[int, ...]) -> None:
        self.chunks.append(make_chunk(request, request.num_computed_tokens, num_tokens, block_table))
        self.touched.add(request.request_id)
        self.budget_left -= num_tokens
        self.num_tokens += num_tokens

    def add_decodes(self, requests: Sequence[Request], start: int, tables: Sequence[tuple[int, ...]]) -> None:
        """add_chunk(request, 1, table) for requests[start:start + len(tables)], each lacking KV
        for its last token alone (so each samples).
        NOTE: every decode of every step comes through here, a run at a time."""
        scheduled = requests[start:start + len(tables)]
        self.chunks.extend(decode_chunks(scheduled, tables))
        self.touched.update(map(_request_id, scheduled))
        self.budget_left -= len(tables)
        self.num_tokens += len(tables)

    def load(self) -> StepLoad:
        """What the step computes so far, for a cost model (chunks added since the last call summed now)."""
        if self._loaded < len(self.chunks):
            self._load = self._load.with_chunks(self.chunks[self._loaded:])
            self._loaded = len(self.chunks)
        return self._load

    def output(self, finished: tuple[Request, ...]) -> SchedulerOutput:
        return SchedulerOutput(tuple(self.chunks), tuple(self.preempted), tuple(self.swap_out),
                               tuple(self.swap_in), tuple(self.resumed), finished)
