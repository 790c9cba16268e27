"""The incremental bookkeeping of the hot step against a plain rescan of every request.

Each step of a random workload is also run on a copy of the scheduler whose decodes,
running-prefill lookup, decode growth, VIP guard, victim search and update rescan every request
the plain way (one allocate_slots per decode, one stop check and cache_computed per chunk, no
remembered "nobody to preempt"). Both must decide
exactly the same: the same chunks and block tables, preemptions, swaps, finishes, and the same
block pool afterwards (free list and eviction order included)."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdserve.kv.block_pool import Allocated
from pdserve.requests import FinishReason, Priority, Request, RequestState, SamplingParams
from pdserve.scheduler import Scheduler, SchedulerOutput
from pdserve.scheduler.plan import StepPlan
from pdserve.scheduler.queue import Candidate, Group
from pdserve.scheduler.steps import Steps
from pdserve.scheduler.victims import Claim
from pdserve.scheduler.stopping import StopRule, stop_reason
from tests.scheduler.fakes import build, request, step
from tests.scheduler.test_properties import Driver, scenario


def _uncomputed(request: Request) -> int:
    return request.num_tokens - request.num_computed_tokens


class Rescan:
    """The plain versions, bound to one scheduler copy."""

    def __init__(self, s: Scheduler):
        self.s, self.steps = s, s._steps
        steps: Steps = s._steps
        steps.decodes = self.decodes
        steps.reserve_decode_growth = self.reserve_decode_growth
        steps.decoding = self.decoding
        steps._running_prefills = self.running_prefills
        steps._guard.allows = self.allows
        preemptor = steps._preemptor
        preemptor.known_unclaimed = lambda claim: False
        preemptor.pick = lambda plan, claim=None: preemptor._victims.pick(
            s._q.running, plan.touched, s._q.running_rank, claim)

    def decodes(self, plan) -> None:
        for request in tuple(self.s._q.running):
            if plan.budget_left < 1:
                return
            if request.state == RequestState.RUNNING and request.request_id not in plan.touched \
                    and _uncomputed(request) == 1:
                result = self.steps._preemptor.allocate(plan, request, 1)
                if isinstance(result, Allocated):
                    plan.add_chunk(request, 1, result.blocks)

    def reserve_decode_growth(self, plan) -> None:
        plan.growth_reserve = sum(self.s.kv.num_new_blocks(r, 1) for r in self.s._q.running if _uncomputed(r) == 1)

    def decoding(self) -> bool:
        return any(not r.is_prefilling for r in self.s._q.running)

    def running_prefills(self, plan) -> list[Candidate]:
        if plan.prefilling is None:
            q = self.s._q
            plan.prefilling = sorted(q.running_prefill(r, plan.now) for r in q.running if _uncomputed(r) > 1)
        return plan.prefilling

    def allows(self, request: Request) -> bool:
        guard = self.steps._guard
        if request.priority != Priority.VIP:
            return True
        held = sum(guard.worst_case_blocks(r) for r in self.s._q.vips.values())
        return held + guard.worst_case_blocks(request) <= self.s.kv.device.num_blocks

    def update(self, output: SchedulerOutput, sampled: Mapping[str, int]) -> list[Request]:
        finished = []
        for chunk in output.chunks:
            request = chunk.request
            if request.state != RequestState.RUNNING:
                continue
            request.num_computed_tokens = chunk.end
            if chunk.samples:
                request.output_token_ids.append(sampled[request.request_id])
                reason = stop_reason(request, self.s.max_model_len)
                if reason is not None:
                    self.s._finish(request, reason)
                    finished.append(request)
                    continue
            self.s._q.progressed(request)
            self.s.kv.cache_computed(request)
        self.s.kv.end_step()
        return finished


def _decided(output: SchedulerOutput) -> tuple:
    return (tuple((c.request.request_id, c.start, c.num_tokens, c.block_table, c.samples) for c in output.chunks),
            tuple((p.request.request_id, p.mode, p.reason) for p in output.preempted),
            output.swap_out, output.swap_in, tuple(r.request_id for r in output.resumed),
            tuple(r.request_id for r in output.finished))


def _pool(s: Scheduler) -> tuple:
    kv = s.kv
    tables = {rid: kv.block_table(rid) for rid in s._q.requests if kv.has_blocks(rid)}
    return (tables, list(kv.device._free), list(kv.device._cached), list(kv.host._free), kv.stats(),
            {rid: (r.state, r.num_computed_tokens, tuple(r.output_token_ids)) for rid, r in s._q.requests.items()})


class TwinDriver(Driver):
    def step(self) -> None:
        self.arrive()
        self.abort()
        self.deliver()
        twin = copy.deepcopy(self.s)
        rescan = Rescan(twin)
        output, expected = self.s.schedule(), twin.schedule()
        assert _decided(output) == _decided(expected)
        sampled = self.ex.execute(output)
        finished, expected_finished = self.s.update(output, sampled), rescan.update(expected, sampled)
        assert [r.request_id for r in finished] == [r.request_id for r in expected_finished]
        assert _pool(self.s) == _pool(twin)
        self.s.check_integrity()
        self.holds += [(self.step_no + 1, hold) for hold in self.s.take_holds().values()]
        self.clock.advance(0.25)
        self.step_no += 1


@pytest.mark.timeout(300)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario)
def test_incremental_step_decides_as_a_full_rescan(sc: dict) -> None:
    d = TwinDriver(sc)
    while d.busy() and d.step_no < 400:  # equal decisions, not draining, is the point here
        d.step()


def test_nobody_to_preempt_is_remembered_until_a_request_joins_running() -> None:
    s, ex, clock = build(max_running=4, aging_seconds=1.0)
    for rid in ("a", "b"):
        s.add(request(rid, max_tokens=50, priority=Priority.BATCH))
    clock.advance(1.5)  # a and b aged to NORMAL rank while they waited, and keep that rank running
    step(s, ex)
    preemptor = s._steps._preemptor
    normal = Claim(1, Priority.NORMAL)
    assert preemptor.pick(StepPlan(64, clock()), normal) is None
    assert preemptor.known_unclaimed(normal) and preemptor.known_unclaimed(Claim(1, Priority.BATCH))
    assert not preemptor.known_unclaimed(Claim(0, Priority.VIP))  # a VIP may preempt them
    s.add(request("fresh", max_tokens=50, priority=Priority.BATCH))
    step(s, ex)  # admitted: a candidate the remembered answer did not see
    assert not preemptor.known_unclaimed(normal)
    assert preemptor.pick(StepPlan(64, clock()), normal).request_id == "fresh"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=6), st.integers(1, 8), st.integers(1, 8),
       st.lists(st.integers(0, 6), max_size=2), st.lists(st.integers(0, 6), max_size=2), st.booleans(),
       st.integers(2, 16))
def test_stop_rule_built_once_judges_as_the_plain_checks(output: list[int], prompt_len: int, max_tokens: int,
                                                          eos: list[int], stop_ids: list[int], ignore_eos: bool,
                                                          max_model_len: int) -> None:
    sampling = SamplingParams(max_tokens=max_tokens, stop_token_ids=tuple(stop_ids), ignore_eos=ignore_eos)
    r = Request("r", [9] * prompt_len, sampling, eos_token_ids=tuple(eos), output_token_ids=list(output))
    last = output[-1] if output else None
    if last is not None and ((not ignore_eos and last in eos) or last in stop_ids):
        plain = FinishReason.STOP
    elif len(output) >= max_tokens or r.num_tokens >= max_model_len:
        plain = FinishReason.LENGTH
    else:
        plain = None
    assert StopRule.of(r, max_model_len).reason(r) == plain == stop_reason(r, max_model_len)
