"""How requests move between simulated instances. Two implementations side by side:

    ColocatedFlow      (here)       arrival -> least-loaded instance; it prefills and decodes
    DisaggregatedFlow  (disagg.py)  arrival -> decode reservation -> prefill -> KV transfer -> decode
"""

from __future__ import annotations

import abc
from collections.abc import Callable

from pdserve.requests import Request
from pdserve.scheduler import AdmissionError
from pdserve.sim.deployment import Colocated, SimConfig
from pdserve.sim.events import EventLoop
from pdserve.sim.instance import Instance, Role, StepRecord
from pdserve.sim.recorder import Recorder


class Flow(abc.ABC):
    """Routes arrivals to instances and reacts to the end of their steps."""

    def __init__(self, loop: EventLoop, recorder: Recorder):
        self.loop = loop
        self.recorder = recorder
        self.instances: list[Instance] = []

    @abc.abstractmethod
    def arrive(self, request: Request) -> None:
        """A request reaches the router at loop.now."""

    @abc.abstractmethod
    def step_done(self, instance: Instance, record: StepRecord) -> None:
        """An instance finished a step (see instance.py)."""

    def _admit(self, add: Callable[[Request], None], request: Request) -> bool:
        """Queue the request on a scheduler; a refusal is the request's failure."""
        try:
            add(request)
        except AdmissionError as exc:
            self.recorder.fail(request.request_id, f"{type(exc).__name__}: {exc}")
            return False
        return True

    def _account(self, instance: Instance, record: StepRecord) -> None:
        self.recorder.step(instance.name, instance.tp, record.output, record.cost)

    def _emit_tokens(self, record: StepRecord) -> None:
        for chunk in record.output.chunks:
            if chunk.samples:
                self.recorder.token(chunk.request.request_id, record.end_s)
        for request in record.finished:
            self.recorder.finish(request.request_id, record.end_s)


class ColocatedFlow(Flow):
    """`gpus / tp` data-parallel instances; each request goes to the one with the least
    outstanding work (prompt + output tokens of its live requests)."""

    def __init__(self, deployment: Colocated, cfg: SimConfig, loop: EventLoop, recorder: Recorder,
                 check_integrity: bool = False):
        super().__init__(loop, recorder)
        groups = deployment.gpus // deployment.tp
        self.instances = [Instance(f"colocated-{i}", Role.COLOCATED, cfg, deployment.tp, deployment.policy, loop,
                                   self, check_integrity) for i in range(groups)]
        self._load = dict.fromkeys(range(groups), 0)
        self._home: dict[str, int] = {}

    def arrive(self, request: Request) -> None:
        i = min(self._load, key=self._load.__getitem__)
        if self._admit(self.instances[i].scheduler.add, request):
            self._load[i] += _work(request)
            self._home[request.request_id] = i
            self.instances[i].kick()

    def step_done(self, instance: Instance, record: StepRecord) -> None:
        self._account(instance, record)
        self._emit_tokens(record)
        for request in record.finished:
            self._load[self._home.pop(request.request_id)] -= _work(request)


def _work(request: Request) -> int:
    return request.num_prompt_tokens + request.sampling.max_tokens
