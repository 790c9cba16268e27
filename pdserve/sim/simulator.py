"""The discrete-event simulator: a workload through a deployment, on the real scheduler.

    for each request: at its arrival time, flow.arrive(request)
    each instance:    schedule() -> price with the cost model -> advance the clock -> update()
    flow:             records every token's time; moves KV between prefill and decode instances

Every instance runs a scheduler built by `make_scheduler` (the same policy classes as the
engine), with the event loop as its clock; requests end by max_tokens (fake samples, no EOS).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pdserve.sim.deployment import Colocated, Deployment, SimConfig, check
from pdserve.sim.disagg import DisaggregatedFlow
from pdserve.sim.events import EventLoop
from pdserve.sim.flow import ColocatedFlow, Flow
from pdserve.sim.recorder import InstanceStats, Recorder, RequestTrace, StepSample
from pdserve.sim.workloads import Workload, make_request


@dataclass(frozen=True)
class SimResult:
    workload: Workload
    deployment: Deployment
    config: SimConfig
    traces: tuple[RequestTrace, ...]  # in workload order
    preemptions: dict[str, int]  # by mode
    preemption_reasons: dict[str, int]
    swapped_bytes: float
    kv_transferred_bytes: float
    steps: int  # forward passes, all instances
    executed_flops: float  # including recomputation after preemption
    instances: tuple[InstanceStats, ...]
    samples: tuple[StepSample, ...]  # every priced step, when traced
    wall_s: float  # host seconds the simulation took
    role_changes: tuple[str, ...] = ()  # an elastic split's: each change begun and done, with its time
    admissions: tuple[tuple[str, int], ...] = ()  # ("verdict/reason", how many), where objectives are set

    @property
    def gpus(self) -> int:
        return self.deployment.total_gpus


def simulate(workload: Workload, deployment: Deployment, cfg: SimConfig, *, check_integrity: bool = False,
             trace_steps: bool = False) -> SimResult:
    """Run `workload` to completion. Raises InfeasibleDeployment for a split that cannot run;
    requests that cannot be served are recorded as failed, not raised."""
    check(deployment, cfg)
    started = time.perf_counter()
    loop = EventLoop()
    recorder = Recorder(workload, trace_steps)
    flow = _flow(deployment, cfg, loop, recorder, check_integrity)
    for index, spec in enumerate(workload.requests):
        request = make_request(spec, index)
        loop.at(spec.arrival_s, lambda r=request: flow.arrive(r))
    loop.run()
    return _result(workload, deployment, cfg, recorder, flow, time.perf_counter() - started)


def _flow(deployment: Deployment, cfg: SimConfig, loop: EventLoop, recorder: Recorder, check_integrity: bool) -> Flow:
    if isinstance(deployment, Colocated):
        return ColocatedFlow(deployment, cfg, loop, recorder, check_integrity)
    return DisaggregatedFlow(deployment, cfg, loop, recorder, check_integrity)


def _result(workload: Workload, deployment: Deployment, cfg: SimConfig, recorder: Recorder, flow: Flow,
            wall_s: float) -> SimResult:
    block_bytes = cfg.shape.kv_block_bytes(cfg.block_size)
    instances = tuple(InstanceStats(i.name, i.role.value, i.tp, i.kv_blocks, i.steps, i.busy_s)
                      for i in flow.instances)
    return SimResult(
        workload, deployment, cfg, tuple(recorder.requests.values()), dict(recorder.preemptions),
        dict(recorder.preemption_reasons), recorder.swapped_blocks * block_bytes,
        recorder.kv_transferred_tokens * cfg.shape.kv_bytes_per_token(), recorder.steps, recorder.executed_flops,
        instances, tuple(recorder.samples or ()), wall_s, tuple(recorder.role_changes),
        tuple(sorted(recorder.admissions.items())),
    )
