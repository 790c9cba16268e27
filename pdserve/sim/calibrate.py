"""Fit the `cpu-local` profile to step times of the real engine measured on this machine.

    measure:  prefill chunks of 64..1024 tokens alone, and decode steps of batches 1..16,
              each Engine.step() (schedule + forward + sampling + update) timed by a clock
    bandwidth: B = bytes / time of one streaming read of every weight (a sum per tensor):
              measured directly, because a decode step's weight read and a fixed overhead are
              otherwise indistinguishable
    fit:      t = max(flops / F, bytes / B) + overhead + sequences x per_sequence
              (the cost model at tp = 1, efficiencies 1, plus the engine's per-sequence cost:
              SimConfig.chunk_overhead_s), minimising squared relative error over F and the
              two overheads (solved exactly for each F)
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pdserve.requests import Priority, SamplingParams
from pdserve.sim.clocks import EngineClock, timed_step
from pdserve.sim.costmodel import StepCostModel, StepLoad
from pdserve.sim.hardware import HardwareProfile
from pdserve.sim.shapes import ModelShape

PREFILL_SIZES = (64, 128, 256, 512, 1024)
DECODE_BATCHES = (1, 2, 4, 8, 16)
GREEDY = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


@dataclass(frozen=True)
class StepSample:
    """One measured engine step: its chunks as (query tokens, context after) and its time."""

    kind: str  # "prefill" | "decode"
    chunks: tuple[tuple[int, int], ...]
    seconds: float


@dataclass(frozen=True)
class Fit:
    profile: HardwareProfile
    chunk_overhead_s: float
    samples: tuple[StepSample, ...]
    predicted: tuple[float, ...]

    def relative_errors(self) -> list[float]:
        return [p / s.seconds - 1 for p, s in zip(self.predicted, self.samples)]


def _prompt(n: int, salt: int) -> list[int]:
    return [1000 + (salt * 7919 + i * 31) % 40_000 for i in range(n)]


def measure_prefills(engine: Any, clock: EngineClock, sizes: Sequence[int] = PREFILL_SIZES,
                     reps: int = 2) -> list[StepSample]:
    """Each size alone in a step; the median of `reps` runs."""
    samples = []
    for n in sizes:
        times = []
        for r in range(reps):
            engine.add_request(f"cal-p{n}-{r}", _prompt(n, n * 10 + r), GREEDY, Priority.NORMAL)
            result, seconds = timed_step(engine, clock)
            assert result.num_tokens == n, f"a {n}-token prompt must run in one step"
            times.append(seconds)
            _drain(engine)
        samples.append(StepSample("prefill", ((n, n),), statistics.median(times)))
    return samples


def measure_decodes(engine: Any, clock: EngineClock, batches: Sequence[int] = DECODE_BATCHES, steps: int = 4,
                    prompt: int = 32) -> list[StepSample]:
    """`batches` requests decoding together; the median step of `steps`."""
    samples = []
    decode = SamplingParams(max_tokens=steps + 2, temperature=0.0, ignore_eos=True)
    for b in batches:
        for i in range(b):
            engine.add_request(f"cal-d{b}-{i}", _prompt(prompt, b * 100 + i), decode, Priority.NORMAL)
        engine.step()
        timed = [timed_step(engine, clock) for _ in range(steps)]
        chunks = tuple((c.num_tokens, c.end) for c in timed[-1][0].chunks)
        samples.append(StepSample("decode", chunks, statistics.median(t for _, t in timed)))
        _drain(engine)
    return samples


def measure_bandwidth(tensors: Sequence[Any], clock: EngineClock, reps: int = 3) -> float:
    """Bytes/s of reading `tensors` (torch) once each, the median of `reps` passes."""
    import torch

    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    times = []
    with torch.inference_mode():
        for _ in range(reps):
            start = clock.now()
            for t in tensors:
                t.sum()
            times.append(clock.now() - start)
    return nbytes / statistics.median(times)


def _drain(engine: Any) -> None:
    while engine.has_unfinished():
        engine.step()


def _rooflines(shape: ModelShape, base: HardwareProfile, flops: float, bandwidth: float,
               samples: Sequence[StepSample]) -> list[float]:
    """max(compute, memory) of each sample, without the fixed or per-sequence overheads."""
    model = StepCostModel(base.calibrated(peak_flops=flops, mem_bandwidth_bytes_s=bandwidth, step_overhead_s=0.0),
                          shape, 1)
    return [model.step_time(s.chunks).total_s for s in samples]


def _overheads(roof: Sequence[float], samples: Sequence[StepSample]) -> tuple[float, float, float]:
    """Best (step overhead, per-sequence overhead) >= 0 for fixed rooflines, and the error.

    Relative residual (r + o + n c) / t - 1 is linear in (o, c): weighted least squares in
    closed form, falling back to one parameter when the other would be negative.
    """
    a = [1 / s.seconds for s in samples]
    b = [len(s.chunks) / s.seconds for s in samples]
    y = [1 - r / s.seconds for r, s in zip(roof, samples)]
    aa, bb, ab = sum(x * x for x in a), sum(x * x for x in b), sum(p * q for p, q in zip(a, b))
    ay, by = sum(p * q for p, q in zip(a, y)), sum(p * q for p, q in zip(b, y))
    det = aa * bb - ab * ab
    o, c = ((bb * ay - ab * by) / det, (aa * by - ab * ay) / det) if det > 0 else (-1.0, -1.0)
    if o < 0 or c < 0:
        o, c = max(0.0, ay / aa), 0.0
        alt_c = max(0.0, by / bb)
        if _sq(a, b, y, 0.0, alt_c) < _sq(a, b, y, o, c):
            o, c = 0.0, alt_c
    return o, c, _sq(a, b, y, o, c)


def _sq(a: Sequence[float], b: Sequence[float], y: Sequence[float], o: float, c: float) -> float:
    return sum((o * p + c * q - t) ** 2 for p, q, t in zip(a, b, y))


def _error(shape: ModelShape, base: HardwareProfile, samples: Sequence[StepSample], flops: float,
           bandwidth: float) -> float:
    return _overheads(_rooflines(shape, base, flops, bandwidth, samples), samples)[2]


def fit_profile(samples: Sequence[StepSample], shape: ModelShape, base: HardwareProfile,
                bandwidth: float | None = None, rounds: int = 200) -> Fit:
    """Log-grid then coordinate search over FLOP/s (and bandwidth unless measured); the
    overheads are solved exactly at each point."""
    bandwidths = [bandwidth] if bandwidth else [base.mem_bandwidth_bytes_s * 2.0 ** j for j in range(-5, 6)]
    grid = [(base.peak_flops * 2.0 ** i, b) for i in range(-5, 6) for b in bandwidths]
    best, (flops, bandwidth) = min((_error(shape, base, samples, f, b), (f, b)) for f, b in grid)
    free_bandwidth = len(bandwidths) > 1
    step = 1.5
    for _ in range(rounds):
        trials = [(flops * step, bandwidth), (flops / step, bandwidth)]
        if free_bandwidth:
            trials += [(flops, bandwidth * step), (flops, bandwidth / step)]
        err, trial = min((_error(shape, base, samples, *t), t) for t in trials)
        if err < best:
            best, (flops, bandwidth) = err, trial
        elif (step := step ** 0.5) < 1.0005:
            break
    roof = _rooflines(shape, base, flops, bandwidth, samples)
    overhead, per_seq, _ = _overheads(roof, samples)
    profile = base.calibrated(peak_flops=flops, mem_bandwidth_bytes_s=bandwidth, step_overhead_s=overhead)
    predicted = tuple(r + overhead + len(s.chunks) * per_seq for r, s in zip(roof, samples))
    return Fit(profile, per_seq, tuple(samples), predicted)


def calibrate(engine: Any, clock: EngineClock, shape: ModelShape, base: HardwareProfile,
              log: Callable[[str], None] = lambda m: None) -> Fit:
    """Warm up, measure weight bandwidth, prefills and decodes, fit. `engine` is a pdserve
    Engine whose token budget and chunk cap hold the largest prefill size in one step."""
    engine.add_request("cal-warmup", _prompt(128, 1), GREEDY, Priority.NORMAL)
    _drain(engine)
    bandwidth = measure_bandwidth(list(engine.loaded.model.parameters()), clock)
    log(f"calibrating: weights stream at {bandwidth / 1e9:.1f} GB/s")
    log("calibrating: prefill chunks " + ", ".join(map(str, PREFILL_SIZES)))
    samples = measure_prefills(engine, clock)
    log("calibrating: decode batches " + ", ".join(map(str, DECODE_BATCHES)))
    samples += measure_decodes(engine, clock)
    return fit_profile(samples, shape, base, bandwidth)


def load_report(fit: Fit) -> str:
    lines = ["| step | chunks | measured ms | fitted ms | error |", "|---|---|---|---|---|"]
    for s, p, e in zip(fit.samples, fit.predicted, fit.relative_errors()):
        label = f"prefill {s.chunks[0][0]}" if s.kind == "prefill" else f"decode x{len(s.chunks)}"
        load = StepLoad.of(s.chunks)
        lines.append(f"| {label} | {load.query_tokens} tokens | {s.seconds * 1e3:.1f} | {p * 1e3:.1f} | {e:+.0%} |")
    f = fit.profile
    lines.append(f"\nfitted cpu-local: {f.peak_flops / 1e9:.1f} GFLOP/s, {f.mem_bandwidth_bytes_s / 1e9:.2f} GB/s, "
                 f"step overhead {f.step_overhead_s * 1e3:.2f} ms, per sequence {fit.chunk_overhead_s * 1e3:.2f} ms")
    return "\n".join(lines)
