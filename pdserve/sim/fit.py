"""Fitting a device profile and the serving stack's overheads to measured step times.

    t = max(flops / F, bytes / B)              the cost model at tp = 1, efficiencies 1
        + step_overhead                        HardwareProfile.step_overhead_s
        + sequences x per_sequence             SimConfig.chunk_overhead_s
        + context tokens x per_context_token   SimConfig.context_overhead_s

F (and B unless measured) by a log-grid and coordinate search; for each (F, B) the three
overheads are linear, so they are solved exactly (least squares of relative errors, >= 0).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pdserve.sim.costmodel import StepCostModel
from pdserve.sim.hardware import HardwareProfile
from pdserve.sim.shapes import ModelShape


@dataclass(frozen=True)
class StepSample:
    """One measured engine step: its chunks as (query tokens, context after) and its time."""

    kind: str  # "prefill" | "decode" | "mixed"
    chunks: tuple[tuple[int, int], ...]
    seconds: float

    @property
    def context_tokens(self) -> int:
        return sum(end for _, end in self.chunks)


@dataclass(frozen=True)
class Overheads:
    step_s: float = 0.0
    per_sequence_s: float = 0.0
    per_context_token_s: float = 0.0

    def of(self, sample: StepSample) -> float:
        return self.step_s + len(sample.chunks) * self.per_sequence_s + sample.context_tokens * self.per_context_token_s


@dataclass(frozen=True)
class Fit:
    profile: HardwareProfile  # step_overhead_s = overheads.step_s
    overheads: Overheads
    samples: tuple[StepSample, ...]
    predicted: tuple[float, ...]

    def relative_errors(self) -> list[float]:
        return [p / s.seconds - 1 for p, s in zip(self.predicted, self.samples)]

    def scaled(self, speed: float) -> Fit:
        """The same machine running `speed` times as fast: every rate times it, every time
        (overheads, predictions) divided by it."""
        p, o = self.profile, self.overheads
        profile = _profile(p, p.peak_flops * speed, p.mem_bandwidth_bytes_s * speed, p.step_overhead_s / speed)
        overheads = Overheads(o.step_s / speed, o.per_sequence_s / speed, o.per_context_token_s / speed)
        return Fit(profile, overheads, self.samples, tuple(t / speed for t in self.predicted))


def _profile(base: HardwareProfile, flops: float, bandwidth: float, step_s: float = 0.0) -> HardwareProfile:
    return base.calibrated(peak_flops=flops, mem_bandwidth_bytes_s=bandwidth, step_overhead_s=step_s)


def _rooflines(shape: ModelShape, base: HardwareProfile, flops: float, bandwidth: float,
               samples: Sequence[StepSample]) -> np.ndarray:
    model = StepCostModel(_profile(base, flops, bandwidth), shape, 1)
    return np.array([model.step_time(s.chunks).total_s for s in samples])


def _overheads(roof: np.ndarray, samples: Sequence[StepSample]) -> tuple[Overheads, float]:
    """Non-negative least squares by trying every subset of the three terms (8 small solves)."""
    t = np.array([s.seconds for s in samples])
    features = np.array([[1.0, len(s.chunks), s.context_tokens] for s in samples]) / t[:, None]
    target = 1 - roof / t
    best, best_err = np.zeros(3), float(np.sum(target ** 2))
    for k in range(1, 4):
        for subset in itertools.combinations(range(3), k):
            coef, *_ = np.linalg.lstsq(features[:, subset], target, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(3)
            full[list(subset)] = coef
            err = float(np.sum((features @ full - target) ** 2))
            if err < best_err:
                best, best_err = full, err
    return Overheads(*map(float, best)), best_err


def _error(shape: ModelShape, base: HardwareProfile, samples: Sequence[StepSample], flops: float,
           bandwidth: float) -> float:
    return _overheads(_rooflines(shape, base, flops, bandwidth, samples), samples)[1]


def fit_profile(samples: Sequence[StepSample], shape: ModelShape, base: HardwareProfile,
                bandwidth: float | None = None, rounds: int = 200) -> Fit:
    """The profile (FLOP/s, bandwidth unless given, step overhead) and stack overheads that
    best explain `samples`."""
    bandwidths = [bandwidth] if bandwidth else [base.mem_bandwidth_bytes_s * 2.0 ** j for j in range(-5, 6)]
    grid = [(base.peak_flops * 2.0 ** i, b) for i in range(-5, 6) for b in bandwidths]
    best, (flops, bw) = min((_error(shape, base, samples, f, b), (f, b)) for f, b in grid)
    step = 1.5
    for _ in range(rounds):
        trials = [(flops * step, bw), (flops / step, bw)]
        if len(bandwidths) > 1:
            trials += [(flops, bw * step), (flops, bw / step)]
        err, trial = min((_error(shape, base, samples, *t), t) for t in trials)
        if err < best:
            best, (flops, bw) = err, trial
        elif (step := step ** 0.5) < 1.0005:
            break
    roof = _rooflines(shape, base, flops, bw, samples)
    overheads, _ = _overheads(roof, samples)
    predicted = tuple(float(r) + overheads.of(s) for r, s in zip(roof, samples))
    return Fit(_profile(base, flops, bw, overheads.step_s), overheads, tuple(samples), predicted)
