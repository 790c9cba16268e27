"""Synthetic run results for report tests: chats with a steady TBT, documents with a set TTFT."""

from __future__ import annotations

from pdserve.bench import workloads
from pdserve.bench.records import OK, RequestRecord
from pdserve.bench.runner import RunResult


def fake_run(workload: workloads.Workload, tbt_s: float = 0.1, doc_ttft_s: float = 2.0, stall_s: float = 0.0,
             failed: tuple[int, ...] = ()) -> RunResult:
    """Every chat streams one token per message every tbt_s (one gap of stall_s when set)."""
    records = []
    for r in workload.requests:
        rec = RequestRecord.of(r)
        rec.sent_s = r.arrival_s
        ttft = doc_ttft_s if r.kind == workloads.Kind.DOCUMENT else 0.2
        times = [r.arrival_s + ttft + tbt_s * i for i in range(r.max_tokens)]
        if stall_s and r.kind == workloads.Kind.CHAT:
            times = times[:1] + [t + stall_s for t in times[1:]]
        rec.token_times, rec.token_counts = times, [1] * len(times)
        rec.done_s, rec.completion_tokens = times[-1], len(times)
        rec.status = "INTERNAL" if r.index in failed else OK
        records.append(rec)
    duration = max(r.done_s for r in records)
    return RunResult("127.0.0.1:1", workload, 1.7e9, duration, tuple(records), (0.5, 0.7))
