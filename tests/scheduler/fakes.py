"""Test doubles: a fake clock and an executor that plays the SchedulerOutput contract on a fake
KV pool (each slot remembers the token id written there), so wrong block tables, bad swaps or
blocks reused too early show up as wrong context."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import replace

from pdserve.config import CacheConfig, PreemptionConfig, SchedulerConfig
from pdserve.requests import Priority, Request, SamplingParams
from pdserve.scheduler import Scheduler, SchedulerOutput, make_scheduler

KV_BYTES_PER_TOKEN = 1024


class FakeClock:
    def __init__(self, start: float = 0.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def fake_token(request: Request) -> int:
    """Deterministic 'sampled' token: never an eos unless the test asks for one."""
    return 1000 + (len(request.output_token_ids) * 7 + len(request.request_id)) % 97


class FakeExecutor:
    def __init__(self, cache: CacheConfig, sample: Callable[[Request], int] = fake_token):
        self.block_size = cache.block_size
        self.device: list[list[int | None]] = [[None] * cache.block_size for _ in range(cache.num_blocks)]
        self.host: list[list[int | None]] = [[None] * cache.block_size for _ in range(cache.num_host_blocks)]
        self.sample = sample
        self.steps = 0

    def execute(self, output: SchedulerOutput) -> dict[str, int]:
        for dev, host in output.swap_out:
            self.host[host] = list(self.device[dev])
        for host, dev in output.swap_in:
            self.device[dev] = list(self.host[host])
        for chunk in output.chunks:
            self._write(chunk.request.all_token_ids, chunk.block_table, chunk.start, chunk.end)
        for chunk in output.chunks:
            self._check_context(chunk.request, chunk.block_table, chunk.end)
        self.steps += 1
        return {c.request.request_id: self.sample(c.request) for c in output.chunks if c.samples}

    def _write(self, tokens: list[int], table: tuple[int, ...], start: int, end: int) -> None:
        assert len(table) * self.block_size >= end, "block table too short for the chunk"
        for pos in range(start, end):
            self.device[table[pos // self.block_size]][pos % self.block_size] = tokens[pos]

    def _check_context(self, request: Request, table: tuple[int, ...], end: int) -> None:
        tokens = request.all_token_ids
        for pos in range(end):
            got = self.device[table[pos // self.block_size]][pos % self.block_size]
            assert got == tokens[pos], f"{request.request_id}: KV at {pos} is {got}, expected {tokens[pos]}"


def configs(policy: str = "chunked", *, block_size: int = 4, num_blocks: int = 64, num_host_blocks: int = 32,
            watermark: float = 0.0, prefix_cache: bool = True, token_budget: int = 64,
            max_chunk_tokens: int = 32, max_running: int = 16, max_waiting: int = 1000,
            aging_seconds: float | None = 30.0, preemption: PreemptionConfig | None = None,
            time_slice_s: float | None = SchedulerConfig.time_slice_s) -> tuple[SchedulerConfig, CacheConfig]:
    cache = CacheConfig(block_size, num_blocks, num_host_blocks, watermark, prefix_cache)
    sched = SchedulerConfig(policy, token_budget, max_chunk_tokens, max_running, max_waiting, aging_seconds,
                            preemption or PreemptionConfig(), time_slice_s=time_slice_s)
    return sched, cache


def build(policy: str = "chunked", *, max_model_len: int = 4096, clock: FakeClock | None = None,
          hold_finished: bool = False, **kw) -> tuple[Scheduler, FakeExecutor, FakeClock]:
    sched_cfg, cache_cfg = configs(policy, **kw)
    clock = clock or FakeClock()
    scheduler = make_scheduler(sched_cfg, cache_cfg, KV_BYTES_PER_TOKEN, max_model_len, clock,
                               hold_finished=hold_finished)
    return scheduler, FakeExecutor(cache_cfg), clock


def request(rid: str, prompt_len: int = 8, *, max_tokens: int = 4, priority: Priority = Priority.NORMAL,
            prompt: list[int] | None = None, **sampling) -> Request:
    base = zlib.crc32(rid.encode())  # stable across runs, unlike hash()
    tokens = prompt if prompt is not None else [(base + 7 * i) % 50_000 + 100 for i in range(prompt_len)]
    return Request(rid, list(tokens), replace(SamplingParams(), max_tokens=max_tokens, **sampling), priority)


def step(scheduler: Scheduler, executor: FakeExecutor, clock: FakeClock | None = None,
         dt: float = 0.01) -> tuple[SchedulerOutput, list[Request]]:
    output = scheduler.schedule()
    sampled = executor.execute(output)
    finished = scheduler.update(output, sampled)
    scheduler.check_integrity()
    if clock is not None:
        clock.advance(dt)
    return output, finished


def run_until_idle(scheduler: Scheduler, executor: FakeExecutor, clock: FakeClock | None = None,
                   max_steps: int = 10_000) -> list[SchedulerOutput]:
    outputs = []
    while scheduler.has_work():
        assert len(outputs) < max_steps, "scheduler did not drain"
        outputs.append(step(scheduler, executor, clock)[0])
    return outputs
