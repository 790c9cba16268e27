"""One simulated serving instance: the real scheduler, priced by the step cost model.

    kick():  out = scheduler.schedule()               # the same policy classes as the engine
             cost = price(out)                        # swaps, then max(compute, memory) + comm + overhead
             ... cost.total_s later:
             scheduler.update(out, fake samples)      # one FAKE_TOKEN per sampling chunk
             listener.step_done(instance, record)     # the flow records tokens, moves KV
             kick()                                   # the next step starts at once

An instance with nothing to compute (an empty output) goes idle until the flow kicks it again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Protocol

from pdserve.config import CacheConfig, PreemptionConfig, SchedulerConfig
from pdserve.kv.manager import BlockHold
from pdserve.requests import Request
from pdserve.scheduler import Reservation, Scheduler, SchedulerOutput, make_scheduler
from pdserve.sim.costmodel import StepCost, StepCostModel
from pdserve.sim.deployment import SimConfig, cost_model
from pdserve.sim.events import EventLoop
from pdserve.sim.workloads import FAKE_TOKEN


class Role(enum.Enum):
    COLOCATED = "colocated"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class StepRecord:
    start_s: float
    end_s: float
    output: SchedulerOutput
    cost: StepCost
    finished: tuple[Request, ...]
    reserved: tuple[Reservation, ...]
    holds: dict[str, BlockHold]


class StepListener(Protocol):
    def step_done(self, instance: Instance, record: StepRecord) -> None:
        """Called at the end of every step (and of state-changing empty schedules)."""


class Instance:
    def __init__(self, name: str, role: Role, cfg: SimConfig, tp: int, policy: str, loop: EventLoop,
                 listener: StepListener, check_integrity: bool = False, hold_finished: bool | None = None):
        """`hold_finished` (default: a prefill instance's) keeps every finished request's blocks
        for its transfer; an instance that may change role leaves it off and its flow marks the
        requests whose KV it sends (Request.sends_kv), as the service's elastic workers do."""
        self.name, self.role, self.tp = name, role, tp
        self.model: StepCostModel = cost_model(cfg, tp)
        self._block_bytes = cfg.shape.kv_block_bytes(cfg.block_size)
        self._per_chunk_s, self._per_context_s = cfg.chunk_overhead_s, cfg.context_overhead_s
        self._loop, self._listener, self._check = loop, listener, check_integrity
        self.scheduler: Scheduler = make_scheduler(
            _scheduler_config(cfg, self.model, policy), _cache_config(cfg, self.model),
            int(cfg.shape.kv_bytes_per_token()), cfg.max_model_len, loop,
            hold_finished=role == Role.PREFILL if hold_finished is None else hold_finished)
        self.prefill_tokens_per_s = prefill_rate(cfg, self.model)
        self.busy = False
        self.busy_s = 0.0
        self.last_step_s = 0.0  # the last forward pass's seconds (the planner's decode step signal)
        self.steps = 0

    @property
    def kv_blocks(self) -> int:
        return self.scheduler.kv.device.num_blocks

    def price(self, output: SchedulerOutput) -> StepCost:
        chunks = [(c.num_tokens, c.end) for c in output.chunks]
        cost = self.model.step_time(chunks, len(output.swap_out) * self._block_bytes,
                                    len(output.swap_in) * self._block_bytes)
        extra = len(chunks) * self._per_chunk_s + sum(end for _, end in chunks) * self._per_context_s
        return with_stack_overhead(cost, extra)

    def kick(self) -> None:
        """Start a step now unless one is running or there is nothing to schedule."""
        if self.busy or not self.scheduler.has_work():
            return
        output = self.scheduler.schedule()
        if output.is_empty:
            self._settle_empty(output)
            return
        cost = self.price(output)
        self.busy = True
        start = self._loop.now
        self._loop.at(start + cost.total_s, lambda: self._end_step(output, cost, start))

    def _end_step(self, output: SchedulerOutput, cost: StepCost, start: float) -> None:
        sampled = {c.request.request_id: FAKE_TOKEN for c in output.chunks if c.samples}
        finished = self.scheduler.update(output, sampled)
        self.busy = False
        self.busy_s += cost.total_s
        self.last_step_s = cost.total_s
        self.steps += 1
        self._report(StepRecord(start, self._loop.now, output, cost, tuple(finished), *self._taken()))
        self.kick()

    def _settle_empty(self, output: SchedulerOutput) -> None:
        """Reservations or preemptions without a forward pass take no time; then idle."""
        reserved, holds = self._taken()
        if output.preempted or output.finished or reserved or holds:
            now = self._loop.now
            self._report(StepRecord(now, now, output, self.price(output), (), reserved, holds))

    def _taken(self) -> tuple[tuple[Reservation, ...], dict[str, BlockHold]]:
        return tuple(self.scheduler.take_reserved()), self.scheduler.take_holds()

    def _report(self, record: StepRecord) -> None:
        if self._check:
            self.scheduler.check_integrity()
        self._listener.step_done(self, record)


def with_stack_overhead(cost: StepCost, extra_s: float) -> StepCost:
    """The serving stack's own cost added to a priced step (it only ever adds time)."""
    if extra_s <= 0:
        return cost
    return replace(cost, overhead_s=cost.overhead_s + extra_s, total_s=cost.total_s + extra_s)


def _cache_config(cfg: SimConfig, model: StepCostModel) -> CacheConfig:
    """KV pool = (memory x fraction - weights / tp) / (KV bytes per token / tp), in blocks."""
    blocks = model.kv_capacity_tokens(cfg.memory_fraction) // cfg.block_size
    host_blocks = int(model.tp * cfg.host_swap_bytes_per_gpu // cfg.shape.kv_block_bytes(cfg.block_size))
    return CacheConfig(block_size=cfg.block_size, num_blocks=blocks, num_host_blocks=host_blocks,
                       prefix_cache=cfg.prefix_cache)


def prefill_rate(cfg: SimConfig, model: StepCostModel) -> float:
    """Prompt tokens per second of a full step (at most 2,048 tokens): what a worker measures."""
    probe = min(cfg.token_budget, 2048)
    return probe / model.step_time([(probe, probe)]).total_s


def _scheduler_config(cfg: SimConfig, model: StepCostModel, policy: str) -> SchedulerConfig:
    """Recompute-or-swap judged with this instance's own prefill speed and host link."""
    host_link = model.tp * cfg.hardware.host_link_bytes_s
    preemption = PreemptionConfig(prefill_tokens_per_s=prefill_rate(cfg, model), host_link_bytes_per_s=host_link)
    # max_waiting: not the service's bound; a simulated queue refuses no request for its length
    return SchedulerConfig(policy=policy, token_budget=cfg.token_budget, max_chunk_tokens=cfg.max_chunk_tokens,
                           max_running=cfg.max_running, max_waiting=1 << 20, aging_seconds=cfg.aging_seconds,
                           preemption=preemption)
