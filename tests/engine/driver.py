"""Drives an Engine step by step for the engine tests: requests added at chosen steps, the
scheduler's integrity checked after every step, and everything a step reported kept in a Trace."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pdserve.config import CacheConfig, EngineConfig, PreemptionConfig, SchedulerConfig
from pdserve.engine.engine import Engine
from pdserve.model.loader import LoadedModel
from pdserve.requests import PreemptionMode, Priority, Request, RequestState, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)


def tiny_prompt(length: int, vocab_size: int, seed: int) -> list[int]:
    """BOS then `length - 1` seeded random ids above the special tokens."""
    generator = torch.Generator().manual_seed(seed)
    return [1] + torch.randint(3, vocab_size, (length - 1,), generator=generator).tolist()


def make_engine(loaded: LoadedModel, *, block_size: int = 4, num_blocks: int = 256, num_host_blocks: int = 0,
                prefix_cache: bool = True, policy: str = "chunked", token_budget: int = 256,
                max_chunk_tokens: int = 1024, preemption: PreemptionConfig = PreemptionConfig(),
                seed: int = 0, time_slice_s: float | None = None,
                max_running: int = SchedulerConfig.max_running) -> Engine:
    """An engine over an already loaded model (no aging: priorities stay fixed; no time slices unless
    asked for: the engine's clock is real, so they would follow the machine's speed)."""
    cache = CacheConfig(block_size=block_size, num_blocks=num_blocks, num_host_blocks=num_host_blocks,
                        prefix_cache=prefix_cache)
    scheduler = SchedulerConfig(policy=policy, token_budget=token_budget, max_chunk_tokens=max_chunk_tokens,
                                aging_seconds=None, preemption=preemption, time_slice_s=time_slice_s,
                                max_running=max_running)
    config = EngineConfig(attention_backend="torch", seed=seed, cache=cache, scheduler=scheduler)
    return Engine(config, loaded=loaded)


@dataclass(frozen=True)
class Arrival:
    """Add this request before step `at` (0: before the first step)."""

    request_id: str
    prompt: list[int]
    sampling: SamplingParams = GREEDY
    priority: Priority = Priority.NORMAL
    at: int = 0


@dataclass(frozen=True)
class PreemptionEvent:
    step: int  # index of the step that reported it
    request: Request
    mode: PreemptionMode
    reason: str
    num_output_tokens: int  # the victim's generated tokens at that moment


@dataclass
class Trace:
    requests: dict[str, Request] = field(default_factory=dict)
    streamed: dict[str, list[int]] = field(default_factory=dict)  # tokens as the step results gave them
    finished_outputs: dict[str, int] = field(default_factory=dict)  # request id -> finished outputs seen
    preemptions: list[PreemptionEvent] = field(default_factory=list)
    running_before: list[tuple[Request, ...]] = field(default_factory=list)  # per step
    resumed_ids: list[str] = field(default_factory=list)
    finished_at: dict[str, int] = field(default_factory=dict)  # request id -> step index
    scheduled: list[tuple[str, ...]] = field(default_factory=list)  # per step: ids of its chunks
    chunk_sizes: list[tuple[int, ...]] = field(default_factory=list)  # per step: tokens of its chunks
    steps: int = 0

    def tokens(self, request_id: str) -> list[int]:
        return self.streamed[request_id]

    def modes(self) -> set[PreemptionMode]:
        return {p.mode for p in self.preemptions}


def run(engine: Engine, arrivals: Sequence[Arrival], max_steps: int = 2000) -> Trace:
    """Step until every request finished; assert integrity after each step, that each request
    reported exactly one finished output, and that what was streamed is what the request holds."""
    trace = Trace()
    pending = sorted(arrivals, key=lambda a: a.at)
    while pending or engine.has_unfinished():
        while pending and pending[0].at <= trace.steps:
            add(engine, trace, pending.pop(0))
        assert trace.steps < max_steps, f"no progress after {max_steps} steps: {engine.scheduler.stats()}"
        step(engine, trace)
    for request_id, request in trace.requests.items():
        assert request.is_finished, request_id
        assert trace.finished_outputs.get(request_id) == 1, request_id
        assert trace.streamed[request_id] == request.output_token_ids, request_id
    return trace


def step(engine: Engine, trace: Trace) -> None:
    trace.running_before.append(tuple(r for r in trace.requests.values() if r.state == RequestState.RUNNING))
    result = engine.step()
    engine.scheduler.check_integrity()
    trace.preemptions += [PreemptionEvent(trace.steps, p.request, p.mode, p.reason, len(p.request.output_token_ids))
                          for p in result.preemptions]
    trace.resumed_ids.extend(r.request_id for r in result.resumed)
    trace.scheduled.append(tuple(c.request.request_id for c in result.chunks))
    trace.chunk_sizes.append(tuple(c.num_tokens for c in result.chunks))
    assert result.num_tokens == sum(trace.chunk_sizes[-1])
    for out in result.outputs:
        trace.streamed.setdefault(out.request_id, []).extend(out.new_token_ids)
        if out.finished:
            trace.finished_outputs[out.request_id] = trace.finished_outputs.get(out.request_id, 0) + 1
            trace.finished_at[out.request_id] = trace.steps
    trace.steps += 1


def add(engine: Engine, trace: Trace, arrival: Arrival) -> None:
    request = engine.add_request(arrival.request_id, arrival.prompt, arrival.sampling, arrival.priority)
    trace.requests[arrival.request_id] = request
    trace.streamed[arrival.request_id] = []


def assert_all_blocks_released(engine: Engine) -> None:
    """Nothing live holds a device or host block: every block is free or in the prefix cache."""
    stats = engine.scheduler.stats()
    assert (stats.running, stats.waiting, stats.swapped) == (0, 0, 0), stats
    assert stats.kv.active == 0 and stats.kv.swapped == 0, stats.kv
    assert stats.kv.free + stats.kv.cached == stats.kv.total, stats.kv
    engine.scheduler.check_integrity()
