"""Figures of a run: TTFT and TBT percentiles per request class, MFU, goodput.

    MFU      = useful model FLOPs / (peak FLOP/s x GPUs x makespan); useful FLOPs count every
               finished request's prefill once and each of its decode steps (recomputation
               after preemption is work, not output, so it is left out)
    goodput  = requests meeting both SLOs per second of the workload's arrival window (first to
               last arrival; the makespan if they all arrive at once): TTFT <= slo_ttft and the
               request's own p99 TBT <= slo_tbt (a failed or unfinished request never meets them).
               The window is the same for every deployment, so a deployment that drops requests
               cannot raise its goodput by finishing early.
    makespan = first arrival to last token

Percentiles, distributions and the SLO check are pdserve/stats.py's (None when there are no samples).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.sim.costmodel import StepLoad
from pdserve.sim.recorder import RequestTrace
from pdserve.sim.shapes import ModelShape
from pdserve.sim.simulator import SimResult
from pdserve.stats import Distribution, Slo, distribution


@dataclass(frozen=True)
class ClassSummary:
    kind: str
    requests: int
    finished: int
    ttft_s: Distribution | None  # None: no request of the class got a first token
    tbt_s: Distribution | None  # pooled over every gap of the class's requests


@dataclass(frozen=True)
class RunSummary:
    name: str
    gpus: int
    makespan_s: float
    output_tokens: int
    output_tokens_per_s: float
    mfu: float
    failed: int
    unfinished: int
    preemptions: dict[str, int]
    swapped_gib: float
    steps: int
    classes: dict[str, ClassSummary]
    goodput_rps: float | None  # with an SLO
    slo_met: int | None
    window_s: float  # goodput's denominator


def useful_flops(shape: ModelShape, prompt: int, outputs: int) -> float:
    """A request's prefill (sampling its first token) and its outputs - 1 decode steps."""
    prefill = StepLoad.of([(prompt, prompt)])
    decodes = StepLoad.decodes(outputs - 1, (outputs - 1) * prompt + (outputs - 1) * outputs // 2)
    load = prefill + decodes if outputs > 1 else prefill
    return (load.query_tokens * shape.linear_flops_per_token() + load.chunks * shape.lm_head_flops()
            + load.attended * shape.attention_flops_per_position())


def meets(trace: RequestTrace, slo: Slo) -> bool:
    return trace.finish_s is not None and slo.met_by(trace.ttft_s, trace.gaps())


def summarize(result: SimResult, slo: Slo | None = None) -> RunSummary:
    traces = result.traces
    ends = [t.token_times[-1] for t in traces if t.token_times]
    start = min(t.spec.arrival_s for t in traces)
    makespan = max(ends) - start if ends else 0.0
    outputs = sum(len(t.token_times) for t in traces)
    cfg = result.config
    flops = sum(useful_flops(cfg.shape, t.spec.prompt_tokens, len(t.token_times)) for t in traces if t.token_times)
    peak = cfg.hardware.peak_flops * result.gpus * makespan
    met = sum(meets(t, slo) for t in traces) if slo else None
    window = (max(t.spec.arrival_s for t in traces) - start) or makespan
    return RunSummary(
        result.deployment.name, result.gpus, makespan, outputs, _rate(outputs, makespan), flops / peak if peak else 0.0,
        sum(t.failure is not None for t in traces), sum(t.failure is None and t.finish_s is None for t in traces),
        dict(result.preemptions), result.swapped_bytes / 2**30, result.steps, _classes(traces),
        _rate(met, window) if met is not None else None, met, window,
    )


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def _classes(traces: Sequence[RequestTrace]) -> dict[str, ClassSummary]:
    kinds = dict.fromkeys(t.spec.kind for t in traces)
    return {kind: _class(kind, [t for t in traces if t.spec.kind == kind]) for kind in kinds}


def _class(kind: str, traces: list[RequestTrace]) -> ClassSummary:
    ttfts = [t.ttft_s for t in traces if t.ttft_s is not None]
    gaps = [g for t in traces for g in t.gaps()]
    return ClassSummary(kind, len(traces), sum(t.finish_s is not None for t in traces), distribution(ttfts),
                        distribution(gaps))
