"""A stream continued at another router when its router died (router/flow/reattaching.py), over the fake
fleet: two routers, each its own link to the workers; router A dies (its link cut, its flow
cancelled) at a point of the request, and router B continues the client's request from its
tokens. Whatever the point, the client's tokens and B's make exactly the request's tokens, and
every worker ends with no block taken."""

from __future__ import annotations

import asyncio
import dataclasses
import functools

import pytest

from pdserve.rpc.errors import NotFound, Unavailable
from pdserve.requests import FinishReason, SamplingParams
from router.doors.asks import Ask, Resume, SampleCount, TokenPrompt, check_resume
from router.flow.flow_types import Done, Milestone, NewTokens, OnLeave, Resumed
from tests.router.fake_fleet import FakeDecodeClient
from tests.router.fake_workers import Mode, Trigger
from tests.router.flow_harness import Router, expected, harness, job, router_of, settle

pytestmark = pytest.mark.timeout(60)
LONG = 48  # tokens: long enough to be caught decoding


def _run(test):
    return functools.wraps(test)(lambda **kw: asyncio.run(test(**kw)))


@dataclasses.dataclass
class Seen:
    tokens: list[int] = dataclasses.field(default_factory=list)
    done: Done | None = None
    milestones: list[Milestone] = dataclasses.field(default_factory=list)
    resumed: tuple[int, ...] | None = None


async def _drive(router: Router, j, seen: Seen) -> None:
    async for event in router.flow.run(j):
        if isinstance(event, NewTokens):
            seen.tokens.extend(event.token_ids)
        elif isinstance(event, Done):
            seen.done = event
        elif isinstance(event, Resumed):
            seen.resumed = event.prior
        else:
            seen.milestones.append(event)


async def _started(h, a: Router, j, until, what: str) -> Seen:
    """`j` through router A (every worker slow) until `until(seen)`; then A dies."""
    for w in h.fleet.workers.values():
        w.slow = 4.0
    seen = Seen()
    task = asyncio.ensure_future(_drive(a, j, seen))
    await _until(lambda: until(seen), what)
    await _dies(a, task)
    return seen


async def _dies(router: Router, task: asyncio.Task) -> None:
    """The router's process ends: its connections drop (no call is closed on purpose)."""
    router.link.cut = True
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _until(predicate, what: str, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.005)):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


def _continued(j, seen: Seen, send_tokens: bool):
    prior = tuple(seen.tokens) if send_tokens else None
    return dataclasses.replace(j, resume=Resume(len(seen.tokens), prior))


def _ways(seen: Seen) -> list[str]:
    return [m.attributes["pdserve.reattach"] for m in seen.milestones if m.name == "reattach"]


@pytest.mark.parametrize("send_tokens", [True, False])
@_run
async def test_a_router_dying_mid_decode_leaves_the_request_to_another_router_that_attaches_it(send_tokens):
    async with harness() as h, router_of(h) as a, router_of(h) as b:
        j = job(max_tokens=LONG)
        seen = await _started(h, a, j, lambda s: len(s.tokens) >= 5, "tokens out through router A")
        rest = Seen()
        await _drive(b, _continued(j, seen, send_tokens), rest)
        assert seen.tokens + rest.tokens == expected(max_tokens=LONG)
        assert rest.resumed == tuple(seen.tokens) and rest.done.reason is FinishReason.LENGTH
        assert _ways(rest) == ["attach"]
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_a_router_dying_mid_prefill_leaves_nothing_held_and_the_request_starts_again_at_the_other():
    async with harness() as h, router_of(h) as a, router_of(h) as b:
        j = job(max_tokens=LONG)
        seen = await _started(h, a, j, lambda s: any(m.name == "prefill.chunk" for m in s.milestones),
                              "a chunk prefilled")
        rest = Seen()
        await _drive(b, _continued(j, seen, send_tokens=False), rest)
        assert seen.tokens == [] and rest.tokens == expected(max_tokens=LONG)
        assert _ways(rest) == ["resume"]
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_nobody_holding_the_request_it_goes_on_from_the_clients_tokens_or_is_not_found_without_them():
    async with harness() as h, router_of(h) as b:
        j = job(max_tokens=LONG)
        tokens = expected(max_tokens=LONG)[:7]
        rest = Seen()
        await _drive(b, dataclasses.replace(j, resume=Resume(7, tuple(tokens))), rest)
        assert tokens + rest.tokens == expected(max_tokens=LONG) and _ways(rest) == ["resume"]
        with pytest.raises(NotFound):
            await _drive(b, dataclasses.replace(j, resume=Resume(7)), Seen())
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_a_client_with_every_token_already_gets_its_end_and_nothing_runs():
    async with harness() as h, router_of(h) as b:
        j = job(max_tokens=LONG)
        rest = Seen()
        await _drive(b, dataclasses.replace(j, resume=Resume(LONG, tuple(expected(max_tokens=LONG)))), rest)
        assert rest.tokens == [] and rest.done.reason is FinishReason.LENGTH
        assert sum(w.opened for w in h.fleet.workers.values()) == 0


@_run
async def test_a_request_asking_logprobs_is_not_attached_but_goes_on_from_the_clients_tokens():
    """The worker keeps token ids, not log-probabilities: the orphan is aborted, the rest computed anew."""
    async with harness() as h, router_of(h) as a, router_of(h) as b:
        j = dataclasses.replace(job(max_tokens=LONG), sampling=SamplingParams(max_tokens=LONG, temperature=0.0,
                                                                             logprobs=0))
        seen = await _started(h, a, j, lambda s: len(s.tokens) >= 3, "tokens out through router A")
        rest = Seen()
        await _drive(b, _continued(j, seen, send_tokens=True), rest)
        assert seen.tokens + rest.tokens == expected(max_tokens=LONG) and _ways(rest) == ["resume"]
        assert set((await settle(h.fleet)).values()) == {0}


@_run
async def test_a_storm_of_streams_continued_at_once_each_gets_exactly_its_tokens():
    async with harness() as h, router_of(h) as a, router_of(h) as b:
        for w in h.fleet.workers.values():
            w.slow = 4.0
        jobs = [job(f"r{i}", max_tokens=LONG, prompt=tuple(range(1 + i, 41 + i))) for i in range(12)]
        seen = [Seen() for _ in jobs]
        tasks = [asyncio.ensure_future(_drive(a, j, s)) for j, s in zip(jobs, seen)]
        await _until(lambda: all(s.tokens for s in seen), "every stream under way at router A")
        a.link.cut = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        rests = [Seen() for _ in jobs]
        await asyncio.gather(*(_drive(b, _continued(j, s, send_tokens=True), r) for j, s, r in zip(jobs, seen, rests)))
        for j, s, r in zip(jobs, seen, rests):
            assert s.tokens + r.tokens == expected(j.prompt, LONG)
        assert set((await settle(h.fleet)).values()) == {0}


@pytest.mark.parametrize("point", ["departed", "move"])
@_run
async def test_a_router_dying_mid_migration_leaves_the_request_to_go_on_from_the_clients_tokens(point):
    """Its decode worker drains: the request departs with its KV (held there for the move), and the
    router dies as it departed or as the KV move begins: nothing holds it decoding any more."""
    async with harness(on_leave=OnLeave.MOVE_KV) as h, router_of(h) as a, router_of(h) as b:
        for w in h.fleet.workers.values():
            w.slow = 4.0
        j, seen = job(max_tokens=LONG), Seen()
        task = asyncio.ensure_future(_drive(a, j, seen))
        await _until(lambda: len(seen.tokens) >= 3, "tokens out through router A")
        source = next(w for w in h.fleet.workers.values() if w.role == "decode" and w.sessions)
        cut = Trigger(source.address, point, Mode.CALL, then_call=lambda: setattr(a.link, "cut", True))
        h.fleet.triggers.append(cut)
        source.draining = True
        await _until(lambda: a.link.cut, f"the migration at {point}")
        await _dies(a, task)
        rest = Seen()
        await _drive(b, _continued(j, seen, send_tokens=True), rest)
        assert seen.tokens + rest.tokens == expected(max_tokens=LONG)
        assert set((await settle(h.fleet)).values()) == {0}


@pytest.mark.parametrize("ask,needle", [
    (Ask(TokenPrompt([1, 2]), resume=Resume(2)), "request_id"),
    (Ask(TokenPrompt([1, 2]), request_id="r", count=SampleCount(2), resume=Resume(2)), "n or best_of"),
    (Ask(TokenPrompt([1, 2]), request_id="r", resume=Resume(2, (5,))), "prior_token_ids has 1"),
    (Ask(TokenPrompt([1, 2]), SamplingParams(max_tokens=4), request_id="r", resume=Resume(5)), "beyond max_tokens"),
])
def test_a_continued_stream_that_cannot_be_served_is_refused_before_any_work(ask, needle):
    assert needle in check_resume(ask)
    assert check_resume(dataclasses.replace(ask, resume=None)) is None


@_run
async def test_a_decode_worker_slow_to_answer_find_is_asked_again_before_the_stream_is_judged_lost():
    """The worker holding the request does not answer the first Find in time (busy): it is asked
    again, and the stream attaches there; one that never answers leaves the client UNAVAILABLE
    (try again), not NOT_FOUND (which would end its stream)."""
    async with harness() as h, router_of(h) as a, router_of(h) as b:
        j = job(max_tokens=LONG)
        seen = await _started(h, a, j, lambda s: len(s.tokens) >= 5, "tokens out through router A")
        original, silent = FakeDecodeClient.find, {"times": 1}

        async def slow_once(self, owner, digest, timeout_s):
            if silent["times"]:
                silent["times"] -= 1
                return None
            return await original(self, owner, digest, timeout_s)

        FakeDecodeClient.find = slow_once
        try:
            rest = Seen()
            await _drive(b, _continued(j, seen, send_tokens=False), rest)
            assert seen.tokens + rest.tokens == expected(max_tokens=LONG) and _ways(rest) == ["attach"]
            silent["times"] = 10 ** 6
            with pytest.raises(Unavailable):
                await _drive(b, dataclasses.replace(job("other", max_tokens=LONG), resume=Resume(3)), Seen())
        finally:
            FakeDecodeClient.find = original
        assert set((await settle(h.fleet)).values()) == {0}
