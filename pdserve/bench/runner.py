"""Sends a workload to a router with pdserve.client's AsyncClient (on uvloop) and records every
streamed message.

Each request is sent at its arrival time, on one shared client (one channel). The run ends when every
request has finished or `duration_limit_s` has passed since the start; requests still streaming
then are cancelled (UNFINISHED), those not yet due are never sent (NOT_SENT).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

from pdserve.bench.progress import Progress
from pdserve.bench.records import OK, UNFINISHED, RequestRecord
from pdserve.bench.workloads import BenchRequest, Workload
from pdserve.client import AsyncClient, Chunk, ClientOptions, PdserveError

WARM_UP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RunOptions:
    duration_limit_s: float = 600.0
    progress: bool = True
    label: str = "bench"


@dataclass(frozen=True)
class RunResult:
    target: str
    workload: Workload
    started_at: float  # Unix time of t = 0
    duration_s: float  # from t = 0 to the last request's end
    records: tuple[RequestRecord, ...]
    load_avg: tuple[float, float]  # the machine's 1-minute load average at the start and at the end


def finish_reason_name(reason: str) -> str:
    """The client's "stop" / "length" / "abort" as the records name it: the wire enum's name
    (FINISH_REASON_STOP, ...), so records read the same as before the client existed."""
    return f"FINISH_REASON_{reason.upper()}"


class _Run:
    """The state of one run: its clock, its records and its progress bar."""

    def __init__(self, client: AsyncClient, workload: Workload, options: RunOptions):
        self.client = client
        self.workload = workload
        self.records = {r.index: RequestRecord.of(r) for r in workload.requests}
        self.progress = Progress(len(workload.requests), options.label, enabled=options.progress)
        self.t0 = time.perf_counter()
        self.done = self.failed = 0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def send(self, request: BenchRequest) -> None:
        await asyncio.sleep(max(0.0, request.arrival_s - self.now()))
        record = self.records[request.index]
        record.sent_s = self.now()
        try:
            await self._stream(request, record)
            record.status = OK
        except PdserveError as exc:
            record.status, record.detail = exc.code, exc.details
        record.done_s = self.now()
        self.done += 1
        self.failed += not record.ok
        self.progress.update(self.done, self.failed, self.now())

    async def _stream(self, request: BenchRequest, record: RequestRecord) -> None:
        chunks = self.client.stream(request.prompt, priority=request.priority.name.lower(),
                                    max_tokens=request.max_tokens, temperature=request.temperature,
                                    ignore_eos=True, seed=request.seed)
        async for chunk in chunks:
            self._record(chunk, record)

    def _record(self, chunk: Chunk, record: RequestRecord) -> None:
        record.request_id = record.request_id or chunk.request_id
        if chunk.token_ids:
            record.token_times.append(self.now())
            record.token_counts.append(len(chunk.token_ids))
            record.token_ids.extend(chunk.token_ids)
        if chunk.finish_reason is not None:
            record.finish_reason = finish_reason_name(chunk.finish_reason)
            usage = chunk.usage
            record.prompt_tokens, record.cached_tokens = usage.prompt_tokens, usage.cached_tokens
            record.completion_tokens, record.preemptions = usage.completion_tokens, usage.preemptions

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.progress.update(self.done, self.failed, self.now())


async def run_async(target: str, workload: Workload, options: RunOptions = RunOptions()) -> RunResult:
    async with AsyncClient(target) as client:
        run = _Run(client, workload, options)
        started_at, load_before = time.time(), os.getloadavg()[0]
        tasks = [asyncio.create_task(run.send(r)) for r in workload.requests]
        ticker = asyncio.create_task(run.tick())
        _, pending = await asyncio.wait(tasks, timeout=options.duration_limit_s)
        ticker.cancel()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, ticker, return_exceptions=True)
        end = run.now()
        for record in run.records.values():
            if record.sent_s is not None and record.done_s is None:
                record.status, record.done_s = UNFINISHED, end
        run.progress.update(run.done, run.failed, end, final=True)
        ends = [r.done_s for r in run.records.values() if r.done_s is not None]
        records = tuple(run.records[i] for i in sorted(run.records))
        return RunResult(target, workload, started_at, max(ends, default=end), records,
                         (load_before, os.getloadavg()[0]))


def run(target: str, workload: Workload, options: RunOptions = RunOptions()) -> RunResult:
    """Runs the workload to the end (or the time limit) on a fresh uvloop event loop."""
    import uvloop

    return uvloop.run(run_async(target, workload, options))


async def _warm_up_async(target: str, count: int) -> None:
    async with AsyncClient(target, ClientOptions(timeout_s=WARM_UP_TIMEOUT_S)) as client:
        for i in range(count):
            await client.generate(f"Warm-up request number {i}: say something short.", max_tokens=4,
                                  temperature=0.0, ignore_eos=True)


def warm_up(target: str, count: int = 2) -> None:
    """A few tiny requests, so one-time costs (first forward pass, connections) stay out of a run."""
    import uvloop

    uvloop.run(_warm_up_async(target, count))
