"""The screen table and the JSON document of one bench run."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from pdserve.bench.runner import RunResult
from pdserve.bench.stats import GroupSummary, summarize_run
from pdserve.stats import Distribution, Slo

HEADER = (f"{'group':14} {'reqs':>4} {'ok':>4} | {'TTFT s p50':>10} {'p90':>6} {'p99':>6} | "
          f"{'TBT ms p50':>10} {'p99':>6} {'max':>6} | {'lat s p50':>9} {'p99':>6} | "
          f"{'tok/s':>6} {'good':>4} {'preempt':>7}  failed")


def _s(d: Distribution | None, field: str, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if d is None else f"{getattr(d, field) * scale:.{digits}f}"


def table_row(g: GroupSummary) -> str:
    failed = ", ".join(f"{k}={v}" for k, v in g.failed.items()) or "-"
    return (f"{g.name:14} {g.requests:4d} {g.completed:4d} | {_s(g.ttft, 'p50'):>10} {_s(g.ttft, 'p90'):>6} "
            f"{_s(g.ttft, 'p99'):>6} | {_s(g.tbt, 'p50', 1e3, 0):>10} {_s(g.tbt, 'p99', 1e3, 0):>6} "
            f"{_s(g.tbt, 'max', 1e3, 0):>6} | {_s(g.latency, 'p50'):>9} {_s(g.latency, 'p99'):>6} | "
            f"{g.output_tokens_per_s:6.1f} {g.goodput:4d} {g.preemptions:7d}  {failed}")


def format_table(result: RunResult, groups: tuple[GroupSummary, ...], slo: Slo) -> str:
    w = result.workload
    title = (f"workload {w.name}: {len(w.requests)} requests, seed {w.seed}, rate {w.rate:.2f}/s, "
             f"{result.duration_s:.1f} s against {result.target}; SLO TTFT {slo.ttft_s:g} s, TBT {slo.tbt_s:g} s; "
             f"load average {result.load_avg[0]:.1f} -> {result.load_avg[1]:.1f} on {os.cpu_count()} CPUs")
    return "\n".join([title, HEADER, "-" * len(HEADER), *map(table_row, groups)])


def to_json(result: RunResult, slo: Slo) -> dict:
    """Everything: the workload's parameters, the summaries and every request with its token times."""
    w = result.workload
    groups = summarize_run(result.records, result.duration_s, slo)
    return {
        "target": result.target,
        "workload": {"name": w.name, "seed": w.seed, "rate": w.rate, "requests": len(w.requests)},
        "slo": asdict(slo),
        "started_at": result.started_at,
        "duration_s": result.duration_s,
        "machine": {"cpus": os.cpu_count(), "load_avg_start": result.load_avg[0], "load_avg_end": result.load_avg[1]},
        "summary": {g.name: asdict(g) for g in groups},
        "requests": [r.to_dict() for r in result.records],
    }


def write_json(path: str | Path, document: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(document, indent=1) + "\n")
