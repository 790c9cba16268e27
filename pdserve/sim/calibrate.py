"""Measure the real engine's step times on this machine, for fitting the `cpu-local` profile.

    bandwidth  bytes / time of one streaming read of every weight (a sum per tensor), measured
               directly: a decode step's weight read and a fixed overhead are otherwise
               indistinguishable
    prefill    prompts of 64..1024 tokens, each alone in a step; then a few decode steps of that
               one sequence at that context (the engine's per-context-token cost shows there)
    decode     batches of 1..16 sequences of 100-token prompts decoding together
    mixed      each batch's decodes plus one new 128-token prompt in the same step

Every Engine.step() (schedule + forward + sampling + update) is timed by an EngineClock;
fit.py turns the samples into a profile and the stack's overheads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pdserve.requests import Priority, SamplingParams
from pdserve.sim.clocks import EngineClock, timed_step
from pdserve.sim.costmodel import StepLoad
from pdserve.sim.fit import Fit, StepSample, fit_profile
from pdserve.sim.hardware import HardwareProfile
from pdserve.sim.shapes import ModelShape
from pdserve.stats import median

PREFILL_SIZES = (64, 128, 256, 512, 1024)
DECODE_BATCHES = (1, 2, 4, 8, 16)
DECODE_STEPS = 6


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _prompt(n: int, salt: int) -> list[int]:
    return [1000 + (salt * 7919 + i * 31) % 40_000 for i in range(n)]


def _decode_sample(engine: Any, clock: EngineClock, steps: int) -> StepSample:
    timed = [timed_step(engine, clock) for _ in range(steps)]
    chunks = tuple((c.num_tokens, c.end) for c in timed[steps // 2][0].chunks)
    return StepSample("decode", chunks, median(t for _, t in timed))


def measure_prefills(engine: Any, clock: EngineClock, sizes: Sequence[int] = PREFILL_SIZES,
                     steps: int = DECODE_STEPS) -> list[StepSample]:
    """Each size alone in a step, then `steps` decodes of it (median)."""
    samples = []
    for n in sizes:
        engine.add_request(f"cal-p{n}", _prompt(n, n), _greedy(steps + 2), Priority.NORMAL)
        result, seconds = timed_step(engine, clock)
        assert result.num_tokens == n, f"a {n}-token prompt must run in one step"
        samples += [StepSample("prefill", ((n, n),), seconds), _decode_sample(engine, clock, steps)]
        _drain(engine)
    return samples


def measure_decodes(engine: Any, clock: EngineClock, batches: Sequence[int] = DECODE_BATCHES,
                    steps: int = DECODE_STEPS, prompt: int = 100, joining: int = 128) -> list[StepSample]:
    """`b` requests decoding together for each b (the median step of `steps`), then one step
    of their decodes with a `joining`-token prompt's prefill."""
    samples = []
    for b in batches:
        for i in range(b):
            engine.add_request(f"cal-d{b}-{i}", _prompt(prompt, b * 100 + i), _greedy(steps + 3), Priority.NORMAL)
        engine.step()
        samples.append(_decode_sample(engine, clock, steps))
        engine.add_request(f"cal-m{b}", _prompt(joining, b), _greedy(1), Priority.NORMAL)
        result, seconds = timed_step(engine, clock)
        samples.append(StepSample("mixed", tuple((c.num_tokens, c.end) for c in result.chunks), seconds))
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
    return nbytes / median(times)


def _drain(engine: Any) -> None:
    while engine.has_unfinished():
        engine.step()


@dataclass(frozen=True)
class Measurements:
    bandwidth: float  # bytes/s of streaming the weights
    samples: tuple[StepSample, ...]

    def merged(self, other: Measurements) -> Measurements:
        """The mean of two passes over the same steps: taken before and after a run, a load
        that drifts on a shared machine averages out."""
        samples = tuple(StepSample(a.kind, a.chunks, (a.seconds + b.seconds) / 2)
                        for a, b in zip(self.samples, other.samples))
        return Measurements((self.bandwidth + other.bandwidth) / 2, samples)

    def fit(self, shape: ModelShape, base: HardwareProfile) -> Fit:
        return fit_profile(self.samples, shape, base, self.bandwidth)


def measure(engine: Any, clock: EngineClock, log: Callable[[str], None] = lambda m: None) -> Measurements:
    """Warm up, then measure. `engine` is a pdserve Engine whose token budget and chunk cap
    hold the largest prefill size in one step."""
    engine.add_request("cal-warmup", _prompt(128, 1), _greedy(2), Priority.NORMAL)
    _drain(engine)
    bandwidth = measure_bandwidth(list(engine.loaded.model.parameters()), clock)
    log(f"calibrating: weights stream at {bandwidth / 1e9:.1f} GB/s; prefill chunks "
        + ", ".join(map(str, PREFILL_SIZES)) + "; decode batches " + ", ".join(map(str, DECODE_BATCHES)))
    return Measurements(bandwidth, tuple(measure_prefills(engine, clock) + measure_decodes(engine, clock)))


def _label(s: StepSample) -> str:
    if s.kind == "prefill":
        return f"prefill {s.chunks[0][0]}"
    if s.kind == "mixed":
        return f"prefill {max(q for q, _ in s.chunks)} + {len(s.chunks) - 1} decodes"
    return f"decode x{len(s.chunks)} at {s.context_tokens // len(s.chunks)}"


def load_report(fit: Fit) -> str:
    lines = ["| step | query tokens | measured ms | fitted ms | error |", "|---|---|---|---|---|"]
    for s, p, e in zip(fit.samples, fit.predicted, fit.relative_errors()):
        lines.append(f"| {_label(s)} | {StepLoad.of(s.chunks).query_tokens} | {s.seconds * 1e3:.1f} "
                     f"| {p * 1e3:.1f} | {e:+.0%} |")
    f, o = fit.profile, fit.overheads
    lines.append(f"\nfitted cpu-local: {f.peak_flops / 1e9:.1f} GFLOP/s, {f.mem_bandwidth_bytes_s / 1e9:.2f} GB/s, "
                 f"step overhead {o.step_s * 1e3:.2f} ms, per sequence {o.per_sequence_s * 1e3:.2f} ms, "
                 f"per context token {o.per_context_token_s * 1e6:.2f} us")
    return "\n".join(lines)
