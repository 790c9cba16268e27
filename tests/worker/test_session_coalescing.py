"""Tokens that wait while a session's reader is behind go out as one event; a reader that keeps
up sees each as it came; order, kinds and counts never change."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.requests import FinishReason
from pdserve.worker.events import Finished, Tokens
from pdserve.worker.session import Session

pytestmark = pytest.mark.timeout(30)


def _read(session: Session):
    async def main():
        return [event async for event in session.events()]

    return asyncio.run(main())


def test_tokens_waiting_for_the_reader_come_as_one_event_in_order():
    session = Session("r")
    for i in range(3):
        session.push(Tokens((i,)))
    session.push(Finished(FinishReason.LENGTH, 0, 0))
    events = _read(session)
    assert [type(e) for e in events] == [Tokens, Finished]
    assert events[0].token_ids == (0, 1, 2)


def test_a_first_token_with_prompt_logprobs_is_never_merged_into_what_came_before():
    from pdserve.requests import TokenLogprobs

    session = Session("r")
    entry = TokenLogprobs(5, -0.5, ((5, -0.5),))
    session.push(Tokens((1,)))
    session.push(Tokens((2,), (entry,), prompt_logprobs=(entry,)))
    session.push(Tokens((3,), (entry,)))
    session.push(Finished(FinishReason.LENGTH, 0, 0))
    events = _read(session)
    assert [e.token_ids for e in events[:-1]] == [(1,), (2, 3)]
    assert events[1].prompt_logprobs == (entry,) and len(events[1].logprobs) == 2


def test_a_reader_that_keeps_up_sees_each_event_as_it_came():
    async def main():
        session = Session("r")
        seen = []

        async def read():
            async for event in session.events():
                seen.append(event)

        reader = asyncio.ensure_future(read())
        for i in range(3):
            session.push(Tokens((i,)))
            await asyncio.sleep(0.01)  # the reader takes each before the next comes
        session.push(Finished(FinishReason.STOP, 0, 0))
        await reader
        return seen

    events = asyncio.run(main())
    assert [e.token_ids for e in events[:-1]] == [(0,), (1,), (2,)]
