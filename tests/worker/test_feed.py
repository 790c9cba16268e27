"""A router's event feed on a worker (pdserve/worker/feed.py) and the sessions on it
(pdserve/worker/session.py): a step's events of every request in one batch, each request's in
order, its tokens waiting while the router reads joined (what waits is bounded), the end after
what the feed carried, a closed feed failing every session still on it, and a draining worker
saying so on each feed once."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.requests import FinishReason
from pdserve.rpc.drain import Drain
from pdserve.rpc.errors import Unavailable
from pdserve.worker.events import Finished, Preempted, Tokens
from pdserve.worker.feed import Feed, Feeds
from pdserve.worker.session import Ending, Session

pytestmark = pytest.mark.timeout(30)

FINISHED = Finished(FinishReason.LENGTH, 0, 0)


async def _batch(feed: Feed) -> dict:
    return await asyncio.wait_for(anext(feed.batches()), 5)


def test_a_steps_events_of_every_request_come_as_one_batch_each_request_in_order():
    async def main():
        feed = Feeds().open()
        sessions = [Session(f"r{i}", feed=feed) for i in range(3)]
        for i, session in enumerate(sessions):  # one engine step's pushes
            session.push(Tokens((i,)))
        sessions[1].push(Preempted("recompute", "out_of_blocks", "preempted"))
        return await _batch(feed)

    batch = asyncio.run(main())
    assert batch == {"r0": [Tokens((0,))], "r1": [Tokens((1,)), Preempted("recompute", "out_of_blocks", "preempted")],
                     "r2": [Tokens((2,))]}


def test_tokens_waiting_while_the_router_reads_are_joined_and_counted_once():
    async def main():
        feed = Feeds().open()
        session = Session("r", feed=feed)
        for step in range(1000):  # nobody reads: the steps' tokens wait
            session.push(Tokens((step,)))
        session.push(Preempted("swap", "out_of_blocks", "preempted"))
        session.push(Tokens((1000,)))
        session.push(FINISHED)
        batch = await _batch(feed)
        return batch, await session.fed_end(), session

    batch, end, session = asyncio.run(main())
    assert [type(e) for e in batch["r"]] == [Tokens, Preempted, Tokens, Finished]
    assert batch["r"][0].token_ids == tuple(range(1000)) and batch["r"][2].token_ids == (1000,)
    assert end.events == 4 and end.error is None  # what the wire carried, joined
    assert session.ending is Ending.FINISHED and session.tokens == 1001


def test_a_failure_ends_the_session_with_its_error_after_the_events_the_feed_carried():
    async def main():
        feed = Feeds().open()
        session = Session("r", feed=feed)
        session.push(Tokens((1,)))
        session.fail(TimeoutError("KV did not arrive"))
        session.push(Tokens((2,)))  # after its end: never sent
        return await _batch(feed), await session.fed_end(), session.ending

    batch, end, ending = asyncio.run(main())
    assert batch == {"r": [Tokens((1,))]}
    assert end.events == 1 and isinstance(end.error, TimeoutError) and ending is Ending.FAILED


def test_closing_a_feed_fails_its_sessions_and_one_attached_after_fails_at_once():
    async def main():
        feeds = Feeds()
        feed = feeds.open()
        on_it, other = Session("a", feed=feed), Session("b", feed=feeds.open())
        ended = Session("c", feed=feed)
        ended.push(FINISHED)
        ended.detach()
        feeds.close(feed, Unavailable("the router's event feed closed"))
        late = Session("d", feed=feed)
        batches = [b async for b in feed.batches()]
        return [await s.fed_end() for s in (on_it, late, ended)], other.ending, feeds.get(feed.id), len(feeds), batches

    (on_it, late, ended), other, found, left, batches = asyncio.run(main())
    assert isinstance(on_it.error, Unavailable) and isinstance(late.error, Unavailable)
    assert ended.error is None and other is Ending.OPEN
    assert found is None and left == 1 and batches == []  # a closed feed's stream ends


def test_a_session_without_a_feed_streams_as_ever():
    async def main():
        session = Session("r")
        session.push(Tokens((1,)))
        session.push(FINISHED)
        return [e async for e in session.events()], session.tokens

    events, tokens = asyncio.run(main())
    assert events == [Tokens((1,)), FINISHED] and tokens == 1


def test_a_draining_worker_says_so_once_on_every_feed_and_at_once_on_one_opened_after():
    async def main():
        feeds, drain = Feeds(), Drain()
        drain.on_drain(feeds.leave)
        before = feeds.open()
        Session("r", feed=before).push(Tokens((1,)))
        await drain.wait_idle(lambda: 0, 1.0)
        await drain.wait_idle(lambda: 0, 1.0)  # (a second wait begins nothing)
        batch = await _batch(before)
        said = before.take_leaving(), before.take_leaving()
        after = feeds.open()
        woken = await _batch(after)  # though nothing of a request waits there
        return batch, said, woken, after.take_leaving()

    batch, said, woken, said_after = asyncio.run(main())
    assert batch == {"r": [Tokens((1,))]} and said == (True, False)
    assert woken == {} and said_after
