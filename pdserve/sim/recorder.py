"""What a simulation run observed: every token's time, failures, preemptions, step totals."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pdserve.scheduler.output import SchedulerOutput
from pdserve.sim.costmodel import StepCost
from pdserve.sim.workloads import RequestSpec, Workload


@dataclass
class RequestTrace:
    spec: RequestSpec
    token_times: list[float] = field(default_factory=list)  # simulated seconds, one per output token
    finish_s: float | None = None
    failure: str | None = None  # why it was refused (e.g. the prompt does not fit the KV pool)
    preemptions: int = 0

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.spec.arrival_s if self.token_times else None

    def gaps(self) -> list[float]:
        """Time between consecutive output tokens (TBT samples)."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


@dataclass(frozen=True)
class StepSample:
    """One priced step, kept when a run is traced (tests check it against the bounds)."""

    instance: str
    tp: int
    chunks: tuple[tuple[int, int], ...]  # (query tokens, context after)
    swap_blocks: int
    cost: StepCost


@dataclass(frozen=True)
class InstanceStats:
    name: str
    role: str
    tp: int
    kv_blocks: int
    steps: int
    busy_s: float


class Recorder:
    def __init__(self, workload: Workload, trace_steps: bool = False):
        self.requests = {s.request_id: RequestTrace(s) for s in workload.requests}
        self.preemptions: Counter[str] = Counter()  # by mode: recompute | swap
        self.preemption_reasons: Counter[str] = Counter()
        self.swapped_blocks = 0
        self.kv_transferred_tokens = 0
        self.steps = 0
        self.executed_flops = 0.0
        self.samples: list[StepSample] | None = [] if trace_steps else None
        self.role_changes: list[str] = []  # an elastic split's planner: each change begun and done
        self.admissions: Counter[str] = Counter()  # "verdict/reason" of each judgement (admitting.py)

    def admitted(self, verdict: str, reason: str) -> None:
        self.admissions[f"{verdict}/{reason}"] += 1

    def role_change(self, when: float, what: str) -> None:
        self.role_changes.append(f"{when:8.2f} s  {what}")

    def token(self, request_id: str, when: float) -> None:
        self.requests[request_id].token_times.append(when)

    def finish(self, request_id: str, when: float) -> None:
        self.requests[request_id].finish_s = when

    def fail(self, request_id: str, reason: str) -> None:
        self.requests[request_id].failure = reason

    def step(self, instance: str, tp: int, output: SchedulerOutput, cost: StepCost) -> None:
        """Count one step's preemptions, swaps and FLOPs (and keep it when tracing)."""
        for p in output.preempted:
            self.preemptions[p.mode.value] += 1
            self.preemption_reasons[p.reason] += 1
            self.requests[p.request.request_id].preemptions += 1
        swaps = len(output.swap_out) + len(output.swap_in)
        self.swapped_blocks += swaps
        self.executed_flops += cost.flops
        if output.chunks:
            self.steps += 1
        if self.samples is not None:
            chunks = tuple((c.num_tokens, c.end) for c in output.chunks)
            self.samples.append(StepSample(instance, tp, chunks, swaps, cost))
