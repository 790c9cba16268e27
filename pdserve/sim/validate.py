"""`pdserve simulate --validate`: the same small workload on the real engine and in the simulator.

    1. load SmolLM2-135M into an in-process Engine (fp32, CPU, `threads` torch threads)
    2. measure step times for the cpu-local profile (calibrate.py)
    3. run the `validate` workload on the engine: requests added at their arrival times on the
       engine clock, Engine.step() in a loop, every new token stamped by the clock
       (WallClock: perf_counter and sleeps; CpuClock: the stepping thread's CPU time with idle
       waits skipped, for a shared machine: see calibrate.py)
    4. measure the step times again; fit the profile to the mean of both passes
    5. correct for drift: a shared machine's speed moves between the calibration and the run,
       so the weights-read probe is taken again just before and after the run and the profile
       is scaled by (probe around the run) / (probe of the calibration passes)
    6. simulate the same workload, same scheduler settings, on that profile
    7. compare TTFT and TBT p50 / p99
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.config import CacheConfig, EngineConfig, SchedulerConfig
from pdserve.requests import SamplingParams
from pdserve.sim.calibrate import PREFILL_SIZES, Fit, load_report, measure, measure_bandwidth
from pdserve.sim.clocks import CpuClock, EngineClock, WallClock
from pdserve.sim.deployment import Colocated, SimConfig
from pdserve.sim.hardware import cpu_local
from pdserve.sim.shapes import smollm2_135m
from pdserve.sim.simulator import simulate
from pdserve.sim.workloads import Workload, get_workload, make_request
from pdserve.stats import Distribution, distribution

TOKEN_BUDGET, MAX_CHUNK = 256, 128  # short steps: TTFT is not at the mercy of step boundaries


@dataclass(frozen=True)
class Comparison:
    metric: str
    measured_s: float
    simulated_s: float

    @property
    def error(self) -> float:
        return self.simulated_s / self.measured_s - 1


@dataclass(frozen=True)
class Validation:
    fit: Fit
    comparisons: tuple[Comparison, ...]
    engine_wall_s: float
    clock: str
    threads: int
    drift: float  # machine speed during the run / during calibration (weights-read probe)

    def within(self, tolerance: float) -> bool:
        return all(abs(c.error) <= tolerance for c in self.comparisons)

    def text(self) -> str:
        rows = [f"| {c.metric} | {c.measured_s * 1e3:.1f} | {c.simulated_s * 1e3:.1f} | {c.error:+.0%} |"
                for c in self.comparisons]
        return "\n".join([load_report(self.fit), "",
                          f"machine speed during the run / during calibration: x{self.drift:.2f} "
                          "(weights-read probe); the profile above is scaled by it for the simulation", "",
                          f"workload validate ({self.clock} clock, {self.threads} torch threads): "
                          f"the real engine run took {self.engine_wall_s:.1f} s of wall time", "",
                          "| metric | measured ms | simulated ms | error |", "|---|---|---|---|", *rows])


def engine_config(seed: int = 0, token_budget: int = TOKEN_BUDGET, max_chunk: int = MAX_CHUNK) -> EngineConfig:
    cache = CacheConfig(num_blocks=1024, num_host_blocks=64, prefix_cache=False)
    sched = SchedulerConfig(policy="chunked", token_budget=token_budget, max_chunk_tokens=max_chunk)
    return EngineConfig(seed=seed, cache=cache, scheduler=sched)


def sim_config(fit: Fit) -> SimConfig:
    return SimConfig(fit.profile, smollm2_135m(), token_budget=TOKEN_BUDGET, max_chunk_tokens=MAX_CHUNK,
                     prefix_cache=False, max_model_len=8192, chunk_overhead_s=fit.overheads.per_sequence_s,
                     context_overhead_s=fit.overheads.per_context_token_s)


def run_engine(engine, workload: Workload, clock: EngineClock) -> dict[str, list[float]]:
    """Token times (clock seconds since start) per request, arrivals on the same clock."""
    pending = list(enumerate(workload.requests))
    times: dict[str, list[float]] = {r.request_id: [] for r in workload.requests}
    start = clock.now()
    while pending or engine.has_unfinished():
        now = clock.now() - start
        while pending and pending[0][1].arrival_s <= now:
            index, spec = pending.pop(0)
            request = make_request(spec, index)
            sampling = SamplingParams(max_tokens=spec.output_tokens, temperature=0.0, ignore_eos=True)
            engine.add_request(spec.request_id, request.prompt_token_ids, sampling, spec.priority)
        if not engine.has_unfinished():
            clock.wait_until(start + pending[0][1].arrival_s)
            continue
        result = engine.step()
        stamp = clock.now() - start
        for out in result.outputs:
            times[out.request_id].extend(stamp for _ in out.new_token_ids)
    return times


def _figures(workload: Workload, times: dict[str, list[float]]) -> dict[str, Distribution]:
    arrivals = {r.request_id: r.arrival_s for r in workload.requests}
    ttft = [t[0] - arrivals[rid] for rid, t in times.items() if t]
    gaps = [b - a for t in times.values() for a, b in zip(t, t[1:])]
    return {"TTFT": _samples(distribution(ttft), "TTFT"), "TBT": _samples(distribution(gaps), "TBT")}


def _samples(found: Distribution | None, metric: str) -> Distribution:
    if found is None:
        raise ValueError(f"the validate workload produced no {metric} samples")
    return found


def compare(measured: dict[str, Distribution], simulated: dict[str, Distribution]) -> tuple[Comparison, ...]:
    return tuple(Comparison(f"{name} {q}", getattr(measured[name], q), getattr(simulated[name], q))
                 for name in ("TTFT", "TBT") for q in ("p50", "p99"))


CLOCKS: dict[str, type[EngineClock]] = {"wall": WallClock, "cpu": CpuClock}


def validate(threads: int = 1, clock: str = "cpu", seed: int = 0,
             log: Callable[[str], None] = lambda m: None) -> Validation:
    import torch

    from pdserve.engine.engine import Engine

    torch.set_num_threads(threads)
    log(f"loading SmolLM2-135M ({threads} torch threads, {clock} clock)")
    calibrating = Engine(engine_config(seed, 2048, max(PREFILL_SIZES)))
    before = measure(calibrating, CLOCKS[clock](), log)
    engine = Engine(engine_config(seed), loaded=calibrating.loaded)
    workload = get_workload("validate", seed)
    log(f"running {len(workload.requests)} requests on the real engine")
    weights = list(engine.loaded.model.parameters())
    probe = measure_bandwidth(weights, CLOCKS[clock]())
    started = time.perf_counter()
    measured = run_engine(engine, workload, CLOCKS[clock]())
    wall = time.perf_counter() - started
    probe = (probe + measure_bandwidth(weights, CLOCKS[clock]())) / 2
    calibration = before.merged(measure(calibrating, CLOCKS[clock](), log))
    drift = probe / calibration.bandwidth
    fit = calibration.fit(smollm2_135m(), cpu_local())
    result = simulate(workload, Colocated(1, 1, "chunked"), sim_config(fit.scaled(drift)))
    simulated = {t.spec.request_id: t.token_times for t in result.traces}
    comparisons = compare(_figures(workload, measured), _figures(workload, simulated))
    return Validation(fit, comparisons, wall, clock, threads, drift)
