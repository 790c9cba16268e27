"""The three scheduling policies: same mechanism, different composition of one step.

    chunked       priority preemption, decodes, then prefill chunks fill the budget
    fcfs          whole prompts in arrival order first (one may exceed the budget alone),
                  then decodes with what is left: the classic prefill stall
    decode-first  decodes; prefill only while no request is decoding
"""

from __future__ import annotations

from pdserve.scheduler.base import Scheduler
from pdserve.scheduler.output import SchedulerOutput
from pdserve.scheduler.queue import Group


class ChunkedScheduler(Scheduler):
    def schedule(self) -> SchedulerOutput:
        plan = self._begin_step()
        self._steps.priority_preemption(plan)
        self._steps.decodes(plan)
        self._steps.prefills(plan)
        return self._end_step(plan)


class FcfsScheduler(Scheduler):
    def schedule(self) -> SchedulerOutput:
        plan = self._begin_step()
        self._steps.reserve_decode_growth(plan)
        self._steps.prefills(plan)
        self._steps.decodes(plan)
        return self._end_step(plan)


class DecodeFirstScheduler(Scheduler):
    def schedule(self) -> SchedulerOutput:
        plan = self._begin_step()
        self._steps.decodes(plan)
        if self._steps.decoding():
            self._steps.prefills(plan, groups=(Group.SWAPPED,))
        else:
            self._steps.prefills(plan)
        return self._end_step(plan)
