"""Logprobs in the flow's events: one per token (the first from the prefill worker, the rest from
the decode stream), aligned with token_ids, never repeated or lost across retries and resumes."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tests.router.fake_workers import DECODE_POINTS, PREFILL_POINTS, Mode, Trigger, logprobs_at
from router.flow.flow import RequestFlow
from router.flow.flow_types import Done, NewTokens
from tests.router.flow_harness import MAX_TOKENS, PROMPT, expected, harness, job, settle

pytestmark = pytest.mark.timeout(60)

K = 2
CASES = ([("d0", p, m) for p in DECODE_POINTS for m in (Mode.KILL, Mode.STALL, Mode.FAIL)]
         + [("p0", p, m) for p in PREFILL_POINTS for m in (Mode.KILL, Mode.FAIL, Mode.PARTITION)])


def _job(request_id: str = "r", k: int | None = K):
    j = job(request_id)
    return dataclasses.replace(j, sampling=dataclasses.replace(j.sampling, logprobs=k))


def _expected_logprobs(k: int = K) -> list:
    return [logprobs_at(PROMPT, i, k)[0] for i in range(MAX_TOKENS)]


async def _collect(flow, j):
    events, done, milestones = [], None, []
    async for event in flow.run(j):
        if isinstance(event, NewTokens):
            events.append(event)
        elif isinstance(event, Done):
            done = event
        else:
            milestones.append(event.name)
    return events, done, milestones


def _pin(h, address: str) -> None:
    for w in h.pool.workers.values():
        if w.role == h.pool.workers[address].role and w.address != address:
            w.assigned, w.running = 1, 9


def test_every_token_carries_its_logprobs_the_first_from_the_prefill_worker():
    async def main():
        async with harness() as h:
            events, done, _ = await _collect(h.flow, _job())
            assert done is not None
            assert all(len(e.logprobs) == len(e.token_ids) for e in events)
            assert [t for e in events for t in e.token_ids] == expected()
            assert [lp for e in events for lp in e.logprobs] == _expected_logprobs()
            assert events[0].token_ids == (expected()[0],) and len(events[0].logprobs[0].top) == K

    asyncio.run(main())


def test_a_request_without_logprobs_gets_none_and_colocated_mode_carries_them_too():
    async def main():
        async with harness() as h:
            events, _, _ = await _collect(h.flow, _job(k=None))
            assert [t for e in events for t in e.token_ids] == expected()
            assert all(e.logprobs == () for e in events)
        async with harness(prefill=()) as h:
            flow = RequestFlow(h.flow.pool, h.flow.clients, dataclasses.replace(h.flow.config, colocated=True))
            events, _, milestones = await _collect(flow, _job())
            assert "placement.prefill" not in milestones
            assert [lp for e in events for lp in e.logprobs] == _expected_logprobs()

    asyncio.run(main())


@pytest.mark.parametrize("address,point,mode", CASES, ids=[f"{a}-{p}-{m.value}" for a, p, m in CASES])
def test_retries_and_resumes_neither_repeat_nor_lose_logprobs(address, point, mode):
    async def main():
        async with harness() as h:
            _pin(h, address)
            h.fleet.triggers.append(Trigger(address, point, mode, seconds=0.6))
            events, done, milestones = await _collect(h.flow, _job())
            assert h.fleet.triggers[0].fired and done is not None, milestones
            assert all(len(e.logprobs) == len(e.token_ids) for e in events)
            assert [t for e in events for t in e.token_ids] == expected()
            assert [lp for e in events for lp in e.logprobs] == _expected_logprobs()
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())
