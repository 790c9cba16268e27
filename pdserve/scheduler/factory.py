"""Build a scheduler from config: the policy name picks the composition and its policies."""

from __future__ import annotations

import time
from collections.abc import Callable

from pdserve.config import CacheConfig, SchedulerConfig
from pdserve.kv.manager import KVManager
from pdserve.kv.page_groups import PageGroups
from pdserve.scheduler.base import Scheduler
from pdserve.scheduler.chunking import CappedChunks, ChunkPolicy, TimedChunks, WholePrompt
from pdserve.scheduler.finished_kv import FreeFinished, HoldFinished
from pdserve.scheduler.guard import VipReserve
from pdserve.scheduler.ordering import ArrivalOrder, PriorityOrder, QueueOrder
from pdserve.scheduler.policies import ChunkedScheduler, DecodeFirstScheduler, FcfsScheduler
from pdserve.scheduler.preemption_mode import AlwaysRecompute, CostBasedMode, PreemptionModePolicy
from pdserve.scheduler.preemptor import Preemptor
from pdserve.scheduler.slicing import NoSlices, SlicePolicy, StartedStreamSlices
from pdserve.scheduler.state import Queues
from pdserve.scheduler.step_cost import StepCoefficients, StepCostModel
from pdserve.scheduler.steps import Steps
from pdserve.scheduler.victims import LowestClassLatest

POLICIES: dict[str, type[Scheduler]] = {
    "chunked": ChunkedScheduler,
    "fcfs": FcfsScheduler,
    "decode-first": DecodeFirstScheduler,
}


def _order(cfg: SchedulerConfig) -> QueueOrder:
    return ArrivalOrder() if cfg.policy == "fcfs" else PriorityOrder(cfg.aging_seconds)


CHUNKINGS = ("tokens", "time")  # SchedulerConfig.chunking


def _chunking(cfg: SchedulerConfig, step_cost: StepCoefficients | None) -> ChunkPolicy:
    """fcfs: whole prompts; else chunks by tokens, or by time with `step_cost` (measured at start;
    else every token at the preemption model's prefill speed)."""
    if cfg.policy == "fcfs":
        return WholePrompt()
    if cfg.chunking == "tokens":
        return CappedChunks(cfg.max_chunk_tokens)
    base = step_cost or StepCoefficients.from_prefill_speed(cfg.preemption.prefill_tokens_per_s)
    return TimedChunks(StepCostModel(base), cfg.step_time_target_s, cfg.min_chunk_tokens, cfg.max_chunk_tokens)


def _slices(cfg: SchedulerConfig) -> SlicePolicy:
    """fcfs has no classes; elsewhere time slices unless turned off (time_slice_s None)."""
    if cfg.policy == "fcfs" or cfg.time_slice_s is None:
        return NoSlices()
    return StartedStreamSlices(cfg.time_slice_s, cfg.time_slice_min_tokens)


def _modes(cfg: SchedulerConfig, cache: CacheConfig, kv_bytes_per_token: int) -> PreemptionModePolicy:
    if cache.num_host_blocks == 0:
        return AlwaysRecompute()
    return CostBasedMode(cfg.preemption, kv_bytes_per_token, cache.block_size)


def make_scheduler(sched_cfg: SchedulerConfig, cache_cfg: CacheConfig, kv_bytes_per_token: int,
                   max_model_len: int, clock: Callable[[], float] = time.monotonic, *,
                   hold_finished: bool = False, groups: PageGroups | None = None,
                   step_cost: StepCoefficients | None = None) -> Scheduler:
    """Context limit: max_model_len, capped by the device pool so one request always fits alone.
    `hold_finished` (prefill workers): a finished request's blocks stay in a hold until
    release_hold, so its KV can still be sent. `groups`: a hybrid model's layer groups (the pool
    then holds cache_cfg.num_blocks blocks' bytes in pages of one group each). `step_cost`: the
    machine's step cost, for chunks sized by time."""
    if sched_cfg.policy not in POLICIES:
        raise ValueError(f"unknown scheduler policy {sched_cfg.policy!r}; one of {sorted(POLICIES)}")
    if sched_cfg.chunking not in CHUNKINGS:
        raise ValueError(f"unknown chunking {sched_cfg.chunking!r}; one of {list(CHUNKINGS)}")
    kv = KVManager(cache_cfg, groups)
    max_model_len = min(max_model_len, cache_cfg.num_blocks * cache_cfg.block_size)
    queues = Queues(_order(sched_cfg), sched_cfg.max_running)
    preemptor = Preemptor(kv, queues, LowestClassLatest(), _modes(sched_cfg, cache_cfg, kv_bytes_per_token))
    steps = Steps(kv, queues, preemptor, _chunking(sched_cfg, step_cost), VipReserve(kv, queues, max_model_len),
                  _slices(sched_cfg))
    finished_kv = HoldFinished() if hold_finished else FreeFinished()
    return POLICIES[sched_cfg.policy](sched_cfg, kv, queues, steps, finished_kv, max_model_len, clock)
