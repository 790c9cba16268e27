"""Sends a workload to a router over grpc.aio (on uvloop) and records every streamed message.

Each request is sent at its arrival time, on one shared channel. The run ends when every
request has finished or `duration_limit_s` has passed since the start; requests still streaming
then are cancelled (UNFINISHED), those not yet due are never sent (NOT_SENT).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import grpc

from pdserve.bench.progress import Progress
from pdserve.bench.records import OK, UNFINISHED, RequestRecord
from pdserve.bench.workloads import BenchRequest, Workload
from pdserve.requests import Priority
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc

WIRE_PRIORITY = {Priority.VIP: pb.PRIORITY_VIP, Priority.NORMAL: pb.PRIORITY_NORMAL, Priority.BATCH: pb.PRIORITY_BATCH}


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


def wire_request(request: BenchRequest) -> pb.GenerateRequest:
    sampling = pb.SamplingParams(max_tokens=request.max_tokens, temperature=request.temperature, ignore_eos=True,
                                 seed=request.seed)
    return pb.GenerateRequest(text=request.prompt, sampling=sampling, priority=WIRE_PRIORITY[request.priority])


class _Run:
    """The state of one run: its clock, its records and its progress bar."""

    def __init__(self, stub: generation_pb2_grpc.GenerationStub, workload: Workload, options: RunOptions):
        self.stub = stub
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
            await self._stream(wire_request(request), record)
            record.status = OK
        except grpc.aio.AioRpcError as exc:
            record.status, record.detail = exc.code().name, exc.details() or ""
        record.done_s = self.now()
        self.done += 1
        self.failed += not record.ok
        self.progress.update(self.done, self.failed, self.now())

    async def _stream(self, request: pb.GenerateRequest, record: RequestRecord) -> None:
        async for message in self.stub.Generate(request):
            record.request_id = record.request_id or message.request_id
            if message.token_ids:
                record.token_times.append(self.now())
                record.token_counts.append(len(message.token_ids))
                record.token_ids.extend(message.token_ids)
            if message.finish_reason:
                record.finish_reason = pb.FinishReason.Name(message.finish_reason)
                usage = message.usage
                record.prompt_tokens, record.cached_tokens = usage.prompt_tokens, usage.cached_tokens
                record.completion_tokens, record.preemptions = usage.completion_tokens, usage.preemptions

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.progress.update(self.done, self.failed, self.now())


async def run_async(target: str, workload: Workload, options: RunOptions = RunOptions()) -> RunResult:
    async with grpc.aio.insecure_channel(target) as channel:
        run = _Run(generation_pb2_grpc.GenerationStub(channel), workload, options)
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
    async with grpc.aio.insecure_channel(target) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        for i in range(count):
            request = pb.GenerateRequest(text=f"Warm-up request number {i}: say something short.",
                                         sampling=pb.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
            async for _ in stub.Generate(request, timeout=300):
                pass


def warm_up(target: str, count: int = 2) -> None:
    """A few tiny requests, so one-time costs (first forward pass, connections) stay out of a run."""
    import uvloop

    uvloop.run(_warm_up_async(target, count))
