"""The experiment: the requests once without faults, then again under the fault schedule.

    fleet A  start, warm up, no-fault run, blocks back to zero      (A is B with --baseline-fleet same)
    plan     the schedule: seeded faults within [first_s, span], span defaulting to 0.8 x the
             no-fault run's duration (or the preset's fixed schedule)
    fleet B  start, warm up, faulted run with the injector, blocks back to zero
    judge    lost requests, outputs against the no-fault run (each difference a near-tie or real,
             by the tie judge), TBT during and outside faults

Every fleet is stopped in `finally`, whatever happens.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pdserve.bench import runner
from pdserve.bench.workloads import Workload
from pdserve.chaos import analysis, blocks, load, ties
from pdserve.chaos.config import ChaosConfig
from pdserve.chaos.fleet import Fleet, role_of
from pdserve.chaos.injector import FaultRecord, Injector, Outcome
from pdserve.chaos.schedule import Fault, ScheduleSpec, format_schedule, plan
from pdserve.chaos.hosts_fleet import HostsFleet
from pdserve.chaos.separate import SeparateFleet
from pdserve.chaos.up_fleet import UpFleet
from pdserve.chaos.verdict import Verdict

FLEETS = {"separate": SeparateFleet, "up": UpFleet, "hosts": HostsFleet}
POLL_PAST_BOUND_S = 15.0  # blocks are polled this long past the bound, so a late zero still has its time


@dataclass(frozen=True)
class Measured:
    result: runner.RunResult
    faults: tuple[FaultRecord, ...]
    drain: blocks.Drain
    fleet: str  # the fleet's description


@dataclass(frozen=True)
class ChaosResult:
    config: ChaosConfig
    workload: Workload
    schedule: tuple[Fault, ...]
    baseline: Measured
    faulted: Measured
    windows: tuple[analysis.Window, ...]
    comparison: analysis.Comparison
    judgements: tuple[ties.Judgement, ...]  # one per difference in comparison, in order
    tie_judge: str  # which judge made them, for the report
    tbt: analysis.TbtSplit
    verdict: Verdict


class FleetStartError(Exception):
    """A fleet's process exited or did not serve in time while it started."""


class ScheduleError(ValueError):
    """The faults cannot be placed as asked (known only once the no-fault run's length is)."""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def started(config: ChaosConfig) -> Iterator[tuple[Fleet, str]]:
    fleet = FLEETS[config.fleet_kind](config.fleet)
    try:
        _log(f"== starting {fleet.describe()}")
        try:
            target = fleet.start()
        except (RuntimeError, TimeoutError) as exc:
            raise FleetStartError(f"the fleet did not start: {exc}") from exc
        _log(f"   logs in {fleet.logs()}")
        runner.warm_up(target)
        yield fleet, target
    finally:
        fleet.stop()


def measure(fleet: Fleet, target: str, workload: Workload, faults: tuple[Fault, ...], config: ChaosConfig,
            label: str) -> Measured:
    """Blocks are polled from the load's end while faults still in progress end (see blocks)."""
    injector = Injector(fleet, faults, config.recovery_timeout_s, config.plan.max_down_per_role)
    injector.start()
    try:
        result = runner.run(target, workload, runner.RunOptions(config.duration_limit_s, config.progress, label))
        injector.load_finished()
        drain = blocks.drain(fleet.workers(), result.started_at + result.duration_s,
                             config.bound_s + POLL_PAST_BOUND_S, injector.restarting)
    finally:
        injector.load_finished()
        injector.join()
    _log(f"{label}: {result.duration_s:.1f} s; active blocks zero after {drain.describe()}")
    return Measured(result, injector.records, drain, fleet.describe())


def schedule_for(config: ChaosConfig, baseline_s: float) -> tuple[Fault, ...]:
    names = config.fleet.names()
    p = config.plan
    if p.fixed:
        unknown = sorted({f.target for f in p.fixed} - set(names))
        if unknown:
            raise ScheduleError(f"the schedule names workers this fleet lacks: {', '.join(unknown)}")
        return p.fixed
    last = p.span_s if p.span_s is not None else 0.8 * baseline_s
    targets = tuple(n for n in names if role_of(n) in p.roles)
    window = (p.first_s, max(p.first_s, last))

    def spec(count: int) -> ScheduleSpec:
        return ScheduleSpec(count, p.kinds, targets, window, p.stop_s, p.recovery_s, p.max_down_per_role)

    try:
        return plan(spec(p.faults), config.seed)
    except ValueError as exc:
        if p.span_s is not None or p.faults <= 1:
            raise ScheduleError(str(exc)) from exc
        return _fewer(spec, p.faults, config.seed, baseline_s, exc)


def _fewer(spec: Callable[[int], ScheduleSpec], count: int, seed: int, baseline_s: float, refused: ValueError) -> tuple[Fault, ...]:
    """The window follows the no-fault run, which a fast machine finishes sooner: as many of the
    faults as fit there, said so, rather than no run at all."""
    for fewer in range(count - 1, 0, -1):
        try:
            faults = plan(spec(fewer), seed)
        except ValueError:
            continue
        _log(f"== {fewer} of {count} faults fit: the no-fault run took {baseline_s:.1f} s on this machine "
             f"({refused}); --span-s or a larger load (--streams, --documents) makes room")
        return faults
    raise ScheduleError(str(refused)) from refused


def windows_of(records: tuple[FaultRecord, ...], started_at: float, settle_s: float) -> tuple[analysis.Window, ...]:
    return tuple(analysis.Window(r.started_at - started_at, r.ended_at - started_at + settle_s)
                 for r in records if r.started_at is not None and r.ended_at is not None)


def run(config: ChaosConfig) -> ChaosResult:
    workload = load.build(config.load, config.seed)
    with started(config) as (fleet, target):
        baseline = measure(fleet, target, workload, (), config, "no-fault run")
        schedule = schedule_for(config, baseline.result.duration_s)
        print(format_schedule(schedule), flush=True)
        if config.baseline_fleet == "same":
            faulted = measure(fleet, target, workload, schedule, config, "faulted run")
    if config.baseline_fleet != "same":
        with started(config) as (fleet, target):
            faulted = measure(fleet, target, workload, schedule, config, "faulted run")
    return judge(config, workload, schedule, baseline, faulted)


def _count(judgements: tuple[ties.Judgement, ...], sampled: bool, tie: bool) -> int:
    return sum(j.difference.sampled == sampled and j.tie == tie for j in judgements)


def judge(config: ChaosConfig, workload: Workload, schedule: tuple[Fault, ...], baseline: Measured,
          faulted: Measured, tie_judge: ties.TieJudge | None = None) -> ChaosResult:
    """`tie_judge`: None picks one for the fleet (ties.choose); the chaos fleet runs the embedded model."""
    windows = windows_of(faulted.faults, faulted.result.started_at, config.settle_s)
    comparison = analysis.compare(workload, baseline.result.records, faulted.result.records)
    tie_judge = tie_judge or ties.choose(config.ties, deterministic=config.fleet.deterministic)
    judgements = ties.judge_all(tie_judge, workload, comparison.differences)
    injected = [r for r in faulted.faults if r.started_at is not None]
    verdict = Verdict(
        lost=len(analysis.losses(faulted.result.records)), baseline_lost=len(analysis.losses(baseline.result.records)),
        greedy_differ=_count(judgements, False, False), seeded_differ=_count(judgements, True, False),
        greedy_ties=_count(judgements, False, True), seeded_ties=_count(judgements, True, True),
        blocks_zero_after_s=faulted.drain.zero_after_s, baseline_blocks_zero_after_s=baseline.drain.zero_after_s,
        blocks_bound_s=config.bound_s, faults_injected=len(injected),
        faults_not_recovered=sum(r.outcome is Outcome.NOT_RECOVERED for r in injected))
    return ChaosResult(config, workload, schedule, baseline, faulted, windows, comparison, judgements,
                       tie_judge.describe(), analysis.split_tbt(faulted.result.records, windows), verdict)
