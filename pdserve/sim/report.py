"""Tables and JSON for simulation runs: the seed's table next to its own figures and physics."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.sim.bounds import min_decode_step_time, min_prefill_time, min_step_time, min_total_prefill_time
from pdserve.sim.deployment import SimConfig
from pdserve.sim.metrics import ClassSummary, RunSummary
from pdserve.sim.planner import PlanRow
from pdserve.sim.recorder import InstanceStats
from pdserve.sim.simulator import SimResult
from pdserve.sim.workloads import Workload


@dataclass(frozen=True)
class SeedFigure:
    """A row of the seed article's table (8x H100, Llama-3.1-70B), as published."""

    policy: str
    p99_tbt_s: float
    long_ttft_s: float
    mfu: float
    oom_rate: float


SEED_FIGURES = (
    SeedFigure("FCFS", 0.780, 0.420, 0.421, 0.125),
    SeedFigure("decode-first (prefill blocked)", 0.0124, 4.800, 0.386, 0.0),
    SeedFigure("chunked prefill + preemption", 0.0148, 0.650, 0.784, 0.0),
)


@dataclass(frozen=True)
class Bounds:
    """What no schedule can beat on `gpus` devices at 100% of peak (see bounds.py)."""

    gpus: int
    longest_prompt: int
    longest_prefill_s: float
    decode_step_weights_s: float  # a decode step streams the weights at least
    workload_prefill_s: float  # every prompt of the workload, perfectly packed


@dataclass(frozen=True)
class Row:
    summary: RunSummary
    min_step_over_bound: float  # the smallest (step time / its physical bound) over the run's steps
    instances: tuple[InstanceStats, ...]


def physical_bounds(workload: Workload, cfg: SimConfig, gpus: int) -> Bounds:
    longest = max(workload.prompt_tokens())
    return Bounds(gpus, longest, min_prefill_time(cfg.shape, cfg.hardware, longest, gpus),
                  min_decode_step_time(cfg.shape, cfg.hardware, [], gpus),
                  min_total_prefill_time(cfg.shape, cfg.hardware, workload.prompt_tokens(), gpus))


def step_bound_ratio(result: SimResult) -> float:
    """min over traced forward steps of simulated time / physical lower bound (>= 1 always)."""
    cfg = result.config
    ratios = [s.cost.total_s / min_step_time(cfg.shape, cfg.hardware, s.chunks, s.tp)
              for s in result.samples if s.chunks]
    return min(ratios, default=math.nan)


def row(result: SimResult, summary: RunSummary) -> Row:
    return Row(summary, step_bound_ratio(result), result.instances)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.1f}"


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:,.2f}"


_HEADER = ("configuration", "chat TBT p50 ms", "p99 ms", "max ms", "chat TTFT p50 s", "p99 s",
           "long TTFT p50 s", "max s", "MFU", "failed (OOM)", "preempt rec/swap", "out tok/s", "step/bound")


def _figure(summary: ClassSummary | None, metric: str, field: str) -> float | None:
    """`field` of a class's `metric` distribution; None when the class or its samples are missing."""
    d = getattr(summary, metric) if summary is not None else None
    return getattr(d, field) if d is not None else None


def _cells(r: Row, short: str, long: str) -> tuple[str, ...]:
    s = r.summary
    chat, doc = s.classes.get(short), s.classes.get(long)
    pre = f"{s.preemptions.get('recompute', 0)}/{s.preemptions.get('swap', 0)}"
    return (s.name, _ms(_figure(chat, "tbt_s", "p50")), _ms(_figure(chat, "tbt_s", "p99")),
            _ms(_figure(chat, "tbt_s", "max")), _s(_figure(chat, "ttft_s", "p50")),
            _s(_figure(chat, "ttft_s", "p99")), _s(_figure(doc, "ttft_s", "p50")),
            _s(_figure(doc, "ttft_s", "max")), f"{s.mfu:.1%}", f"{s.failed}/{sum(c.requests for c in s.classes.values())}",
            pre, f"{s.output_tokens_per_s:,.0f}", f"{r.min_step_over_bound:.2f}x")


def markdown(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(line[i]) for line in lines)]) for i, h in enumerate(header)]
    fmt = "| " + " | ".join(f"{{:{w}}}" for w in widths) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([fmt.format(*header), rule, *(fmt.format(*line) for line in lines)])


def run_table(rows: Sequence[Row], short_kind: str = "chat", long_kind: str = "document") -> str:
    return markdown(_HEADER, [_cells(r, short_kind, long_kind) for r in rows])


def plan_table(rows: Sequence[PlanRow]) -> str:
    lines = [(r.summary.name, f"{r.goodput_rps:.2f}",
              f"{r.summary.slo_met}/{sum(c.requests for c in r.summary.classes.values())}", f"{r.summary.failed}",
              f"{r.summary.output_tokens_per_s:,.0f}", f"{r.summary.makespan_s:.1f}") for r in rows]
    return markdown(("configuration", "goodput req/s", "met SLO", "failed (OOM)", "out tok/s", "makespan s"), lines)


def seed_table() -> str:
    lines = [(f.policy, _ms(f.p99_tbt_s), _s(f.long_ttft_s), f"{f.mfu:.1%}", f"{f.oom_rate:.1%}") for f in SEED_FIGURES]
    return markdown(("seed article (as published)", "P99 TBT ms", "64K TTFT s", "MFU", "OOM rate"), lines)


def bounds_text(b: Bounds, cfg: SimConfig) -> str:
    return (f"physics on {b.gpus} x {cfg.hardware.name} at 100% of peak, {cfg.shape.name}: "
            f"prefill of one {b.longest_prompt:,}-token prompt >= {b.longest_prefill_s:.2f} s; "
            f"a decode step >= {b.decode_step_weights_s * 1e3:.2f} ms (weights alone); "
            f"every prompt of the workload >= {b.workload_prefill_s:.1f} s of all {b.gpus} devices")


def jsonable(value):
    """dataclasses, dicts and sequences to JSON types; NaN and infinities to None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "value") and hasattr(value, "name"):
        return value.name
    return value
