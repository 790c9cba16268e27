"""Capacity planning: which split of N GPUs serves a workload with the most goodput.

Tries colocated instances at every TP that fits, and every xPyD split (x + y = N) with every
TP pair that fits, simulates the workload on each and ranks them by goodput: requests that
meet both SLOs per second of the workload's arrival window (metrics.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdserve.sim.deployment import Colocated, Deployment, Disaggregated, SimConfig, fits, valid_tps
from pdserve.sim.metrics import RunSummary, Slo, summarize
from pdserve.sim.simulator import simulate
from pdserve.sim.workloads import Workload


@dataclass(frozen=True)
class PlanRow:
    deployment: Deployment
    summary: RunSummary

    @property
    def goodput_rps(self) -> float:
        return self.summary.goodput_rps or 0.0


def _tps(gpus: int, cfg: SimConfig) -> list[int]:
    return [tp for tp in valid_tps(gpus, cfg.shape) if fits(cfg, tp)]


def candidates(gpus: int, cfg: SimConfig, policy: str = "chunked") -> list[Deployment]:
    """Every runnable deployment of exactly `gpus` GPUs: colocated first, then by prefill GPUs."""
    found: list[Deployment] = [Colocated(gpus, tp, policy) for tp in _tps(gpus, cfg)]
    for p in range(1, gpus):
        found += [Disaggregated(p, ptp, gpus - p, dtp, policy)
                  for ptp in _tps(p, cfg) for dtp in _tps(gpus - p, cfg)]
    return found


def plan(workload: Workload, cfg: SimConfig, gpus: int, slo: Slo, policy: str = "chunked",
         progress: Callable[[Deployment], None] | None = None) -> list[PlanRow]:
    """Simulate every candidate; best goodput first (ties: fewer failed requests, then more
    output tokens/s)."""
    rows = []
    for deployment in candidates(gpus, cfg, policy):
        if progress is not None:
            progress(deployment)
        rows.append(PlanRow(deployment, summarize(simulate(workload, deployment, cfg), slo)))
    return sorted(rows, key=lambda r: (-r.goodput_rps, r.summary.failed, -r.summary.output_tokens_per_s))
