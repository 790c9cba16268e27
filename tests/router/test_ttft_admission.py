"""Admission by predicted time to first token, on the fake fleet: the workers' reported queues and
speeds decide the prefill worker and the verdict; a refusal reserves nothing anywhere, a deferral
holds nothing, a retry after a fault is never refused."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from pdserve.admission import AdmissionPolicy, parse_objectives
from pdserve.errors import OverloadedError
from pdserve.requests import Priority
from router.flow.flow_types import Done, Milestone, NewTokens
from tests.router.fake_workers import Mode, Trigger
from tests.router.flow_harness import collect, expected, harness, job, settle

pytestmark = pytest.mark.timeout(60)


def _run(test):
    """The async test, run to its end on a loop of its own."""
    return functools.wraps(test)(lambda: asyncio.run(test()))


def _objectives(ttft: str, defer_max_s: float = 60.0) -> AdmissionPolicy:
    return AdmissionPolicy(parse_objectives(ttft), defer_max_s)


def _load(h, addresses, queued: int, tokens_per_s: float = 1000.0) -> None:
    for address in addresses:
        w = h.fleet.workers[address]
        w.queued_prefill_tokens, w.prefill_tokens_per_s = queued, tokens_per_s


async def _polled(h) -> None:
    await h.pool.refresh()


async def _events(flow, j) -> list:
    return [event async for event in flow.run(j)]


@_run
async def test_the_prefill_worker_with_the_earliest_predicted_first_token_wins_over_a_longer_prefix():
    async with harness() as h:
        _load(h, ("p0", "p1", "d0", "d1"), 0)
        h.fleet.workers["p0"].cached[tuple(range(1, 33))] = 32
        h.fleet.workers["p0"].queued_prefill_tokens = 5000  # 5 s of work ahead of the prompt there
        await _polled(h)
        events = await _events(h.flow, job())
        chosen = next(e for e in events if isinstance(e, Milestone) and e.name == "placement.prefill")
        assert chosen.attributes["pdserve.prefill_worker"] == "p1"
        admission = next(e for e in events if isinstance(e, Milestone) and e.name == "admission")
        assert admission.attributes["pdserve.admission"] == "admit"
        assert admission.attributes["pdserve.ttft.predicted.prefill_worker"] == "p1"
        assert [t for e in events if isinstance(e, NewTokens) for t in e.token_ids] == expected()
        # with equal queues, the longer prefix is the earlier first token
        h.fleet.workers["p0"].queued_prefill_tokens = 0
        await _polled(h)
        events = await _events(h.flow, job("again"))
        chosen = next(e for e in events if isinstance(e, Milestone) and e.name == "placement.prefill")
        assert chosen.attributes["pdserve.prefill_worker"] == "p0"
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_a_request_no_path_serves_within_its_objective_is_refused_before_anything_is_reserved():
    async with harness(admission=_objectives("normal=2")) as h:
        _load(h, ("p0", "p1", "d0", "d1"), 10_000)  # 10 s queued everywhere: neither path is within 2 s
        await _polled(h)
        opened = []
        for w in h.fleet.workers.values():
            original = w.open_session
            w.open_session = lambda wid, blocks, *more, _o=original, _w=w: \
                opened.append(_w.address) or _o(wid, blocks, *more)
        seen = []
        with pytest.raises(OverloadedError, match="refused.*predicted") as refused:
            async for event in h.flow.run(job()):
                seen.append(event)
        assert 7.0 <= refused.value.retry_after_s <= 9.0  # about 10 s predicted, less the 2 s objective
        assert [e.name for e in seen] == ["admission"]
        assert seen[0].attributes["pdserve.admission"] == "refuse"
        assert opened == [] and set(h.fleet.active_blocks().values()) == {0}
        # a class without an objective is admitted on the same fleet
        tokens, done, _ = await collect(h.flow, job("vip", priority=Priority.VIP))
        assert tokens == expected() and done is not None


@_run
async def test_a_short_prompt_is_prefilled_by_its_decode_worker_when_only_that_is_within():
    async with harness(admission=_objectives("normal=2")) as h:
        _load(h, ("p0", "p1"), 10_000)
        _load(h, ("d0", "d1"), 0)
        await _polled(h)
        events = await _events(h.flow, job())
        placement = next(e for e in events if isinstance(e, Milestone) and e.name == "placement")
        assert placement.attributes["pdserve.local_prefill"] is True
        assert placement.attributes["pdserve.local_prefill.reason"] == "objective"
        done = next(e for e in events if isinstance(e, Done))
        assert done.local_prefill and [t for e in events if isinstance(e, NewTokens) for t in e.token_ids] == expected()


@_run
async def test_a_batch_request_waits_at_the_router_holding_nothing_until_its_objective_can_be_met():
    async with harness(admission=_objectives("batch=2")) as h:
        _load(h, ("p0", "p1", "d0", "d1"), 10_000)
        await _polled(h)
        seen: list = []

        async def run():
            async for event in h.flow.run(job(priority=Priority.BATCH)):
                seen.append(event)

        task = asyncio.ensure_future(run())
        while not seen:
            await asyncio.sleep(0.01)
        assert [e.name for e in seen] == ["admission.deferred"]
        await asyncio.sleep(0.2)
        assert set(h.fleet.active_blocks().values()) == {0} and not task.done()
        _load(h, ("p0", "p1", "d0", "d1"), 0)
        await asyncio.wait_for(task, 10)
        admission = next(e for e in seen if isinstance(e, Milestone) and e.name == "admission")
        assert (admission.attributes["pdserve.admission"], admission.attributes["pdserve.admission.reason"]) == (
            "admit", "within")
        assert [t for e in seen if isinstance(e, NewTokens) for t in e.token_ids] == expected()


@_run
async def test_a_batch_request_deferred_longer_than_defer_max_runs_anyway():
    async with harness(admission=_objectives("batch=2", defer_max_s=0.3)) as h:
        _load(h, ("p0", "p1", "d0", "d1"), 10_000)
        await _polled(h)
        started = time.monotonic()
        events = await _events(h.flow, job(priority=Priority.BATCH))
        assert time.monotonic() - started >= 0.3
        admission = next(e for e in events if isinstance(e, Milestone) and e.name == "admission")
        assert admission.attributes["pdserve.admission.reason"] == "deferred_too_long"
        assert [t for e in events if isinstance(e, NewTokens) for t in e.token_ids] == expected()


@_run
async def test_a_deferred_request_ends_at_its_deadline_with_nothing_held():
    async with harness(admission=_objectives("batch=2")) as h:
        _load(h, ("p0", "p1", "d0", "d1"), 10_000)
        await _polled(h)
        with pytest.raises(TimeoutError, match="deferred"):
            await _events(h.flow, job(priority=Priority.BATCH, timeout_s=0.5))
        assert set(h.fleet.active_blocks().values()) == {0}


@_run
async def test_a_retry_after_a_fault_is_never_refused():
    """The queues fill between the first placement and the retry: the retry runs all the same."""
    async with harness(decode=("d0",), admission=_objectives("normal=2")) as h:
        _load(h, ("p0", "p1", "d0"), 0)
        await _polled(h)
        h.fleet.triggers.append(Trigger("d0", "reserved", Mode.STALL, seconds=0.5))  # its calls fail, then it is back
        tokens: list[int] = []
        verdicts = []
        async for event in h.flow.run(job()):
            if isinstance(event, Milestone) and event.name == "admission":
                verdicts.append(event.attributes["pdserve.admission.reason"])
                _load(h, ("p0", "p1", "d0"), 10_000)
            elif isinstance(event, NewTokens):
                tokens.extend(event.token_ids)
        assert tokens == expected()
        assert verdicts[0] == "within" and verdicts[1:] and set(verdicts[1:]) == {"retry"}
        assert set((await settle(h.fleet)).values()) == {0}
