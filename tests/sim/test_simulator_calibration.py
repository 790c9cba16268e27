"""Calibration fit and the validation loop, with fake engines (no model, fast)."""

from dataclasses import dataclass, field

import pytest

from pdserve.sim.calibrate import Measurements, load_report
from pdserve.sim.clocks import CpuClock, EngineClock, WallClock
from pdserve.sim.costmodel import StepCostModel
from pdserve.sim.fit import StepSample, fit_profile
from pdserve.sim.hardware import cpu_local
from pdserve.stats import distribution
from pdserve.sim.shapes import smollm2_135m
from pdserve.sim.validate import Comparison, compare, run_engine
from pdserve.sim.workloads import get_workload

SHAPE = smollm2_135m()


def _synthetic(flops: float, bandwidth: float, overhead: float, per_seq: float, per_ctx: float = 0.0) -> list[StepSample]:
    """Step times a known profile and stack would give, for the shapes calibrate.py measures."""
    truth = StepCostModel(cpu_local().calibrated(peak_flops=flops, mem_bandwidth_bytes_s=bandwidth,
                                                 step_overhead_s=overhead), SHAPE, 1)
    shapes = [((n, n),) for n in (64, 128, 256, 512, 1024)] + [((1, n + 3),) for n in (64, 128, 256, 512, 1024)]
    shapes += [((1, 104),) * b for b in (1, 2, 4, 8, 16)]
    return [StepSample("prefill" if c[0][0] > 1 else "decode", c,
                       truth.step_time(c).total_s + len(c) * per_seq + sum(e for _, e in c) * per_ctx)
            for c in shapes]


def test_fit_recovers_a_known_profile_from_its_step_times():
    fit = fit_profile(_synthetic(60e9, 12e9, 3e-3, 2e-3, 20e-6), SHAPE, cpu_local())
    assert fit.profile.peak_flops == pytest.approx(60e9, rel=0.05)
    assert fit.profile.mem_bandwidth_bytes_s == pytest.approx(12e9, rel=0.1)
    assert fit.overheads.per_context_token_s == pytest.approx(20e-6, rel=0.2)
    assert fit.overheads.per_sequence_s + fit.overheads.step_s == pytest.approx(5e-3, rel=0.2)
    assert fit.profile.step_overhead_s == fit.overheads.step_s
    assert max(abs(e) for e in fit.relative_errors()) < 0.03
    report = load_report(fit)
    assert "prefill 1024" in report and "decode x16 at 104" in report and "per context token" in report


def test_fitted_profile_never_prices_a_step_below_the_base_bounds_it_was_fitted_to():
    fit = fit_profile(_synthetic(80e9, 9e9, 2e-3, 4e-3), SHAPE, cpu_local())
    for sample, predicted in zip(fit.samples, fit.predicted):
        assert predicted >= 0.97 * sample.seconds


class ManualClock(EngineClock):
    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wait_until(self, when: float) -> None:
        self.t = max(self.t, when)


@dataclass
class _Out:
    request_id: str
    new_token_ids: tuple


@dataclass
class _Result:
    outputs: list


@dataclass
class FakeEngine:
    """One token per live request per step; each step costs 50 ms of the clock."""

    clock: ManualClock
    live: dict = field(default_factory=dict)
    added_at: dict = field(default_factory=dict)

    def add_request(self, request_id, prompt, sampling, priority):
        self.live[request_id] = sampling.max_tokens
        self.added_at[request_id] = self.clock.now()

    def has_unfinished(self):
        return bool(self.live)

    def step(self):
        self.clock.t += 0.05
        outs = [_Out(rid, (7,)) for rid in self.live]
        self.live = {rid: n - 1 for rid, n in self.live.items() if n > 1}
        return _Result(outs)


def test_run_engine_adds_requests_at_their_arrival_and_stamps_every_token():
    workload = get_workload("validate")
    clock = ManualClock()
    engine = FakeEngine(clock)
    times = run_engine(engine, workload, clock)
    for spec in workload.requests:
        assert len(times[spec.request_id]) == spec.output_tokens
        assert spec.arrival_s <= engine.added_at[spec.request_id] < spec.arrival_s + 0.05 + 1e-9
        assert times[spec.request_id][0] == pytest.approx(engine.added_at[spec.request_id] + 0.05)


def test_cpu_clock_skips_idle_time_and_wall_clock_sleeps():
    cpu = CpuClock()
    cpu.wait_until(5.0)
    assert 5.0 <= cpu.now() < 5.5
    wall = WallClock()
    wall.wait_until(0.02)
    assert wall.now() >= 0.02


def test_comparison_errors_are_relative_to_the_measurement():
    m = {"TTFT": distribution([1.0, 2.0]), "TBT": distribution([0.1, 0.1])}
    s = {"TTFT": distribution([1.1, 2.2]), "TBT": distribution([0.09, 0.09])}
    rows = compare(m, s)
    assert [r.metric for r in rows] == ["TTFT p50", "TTFT p99", "TBT p50", "TBT p99"]
    assert rows[0].error == pytest.approx(0.1) and rows[2].error == pytest.approx(-0.1)
    assert Comparison("x", 2.0, 1.0).error == -0.5


def test_a_measured_bandwidth_is_kept_and_the_rest_is_fitted_around_it():
    fit = fit_profile(_synthetic(70e9, 10e9, 4e-3, 1e-3), SHAPE, cpu_local(), bandwidth=10e9)
    assert fit.profile.mem_bandwidth_bytes_s == 10e9
    assert fit.profile.peak_flops == pytest.approx(70e9, rel=0.05)
    assert fit.overheads.step_s == pytest.approx(4e-3, rel=0.2)
    assert fit.overheads.per_sequence_s == pytest.approx(1e-3, rel=0.3)
    assert fit.overheads.per_context_token_s == pytest.approx(0.0, abs=1e-7)


def test_two_measurement_passes_merge_into_their_mean():
    a = Measurements(10e9, tuple(_synthetic(60e9, 10e9, 3e-3, 2e-3)))
    b = Measurements(12e9, tuple(StepSample(s.kind, s.chunks, s.seconds * 1.2) for s in a.samples))
    merged = a.merged(b)
    assert merged.bandwidth == 11e9
    assert [m.seconds for m in merged.samples] == pytest.approx([s.seconds * 1.1 for s in a.samples])
    assert merged.fit(SHAPE, cpu_local()).profile.mem_bandwidth_bytes_s == 11e9


def test_a_faster_machine_scales_rates_up_and_times_down():
    fit = fit_profile(_synthetic(60e9, 12e9, 3e-3, 2e-3, 10e-6), SHAPE, cpu_local())
    fast = fit.scaled(1.25)
    assert fast.profile.peak_flops == pytest.approx(1.25 * fit.profile.peak_flops)
    assert fast.profile.mem_bandwidth_bytes_s == pytest.approx(1.25 * fit.profile.mem_bandwidth_bytes_s)
    assert fast.overheads.per_sequence_s == pytest.approx(fit.overheads.per_sequence_s / 1.25)
    model = StepCostModel(fast.profile, SHAPE, 1)
    for sample, predicted in zip(fast.samples, fast.predicted):
        assert model.step_time(sample.chunks).total_s + fast.overheads.of(sample) - fast.overheads.step_s \
            == pytest.approx(predicted, rel=1e-6)
