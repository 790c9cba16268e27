"""The stream interval (router/doors/stream_interval.py) and the pacer that applies it
(router/doors/pacing.py): tokens held per sample until due, the first at once, anything else sending
what is held first; nothing lost, nothing reordered."""

from __future__ import annotations

import asyncio

import pytest

from router.flow.flow_types import Done, Milestone, NewTokens
from router.doors.pacing import Ending, Pacer
from router.doors.stream_interval import MAX_TOKENS, StreamInterval, parse_stream_interval

pytestmark = pytest.mark.timeout(30)
WAIT_S = 10.0  # for an item the pacer must hand over; never reached when it behaves


@pytest.mark.parametrize("text, interval", [
    ("4", StreamInterval(tokens=4)), ("20ms", StreamInterval(seconds=0.02)),
    (" 2.5MS ", StreamInterval(seconds=0.0025)),
    ("off", StreamInterval()), ("0", StreamInterval()), ("1", StreamInterval(tokens=1)),
])
def test_an_interval_parses_as_tokens_or_milliseconds(text, interval):
    assert parse_stream_interval(text) == interval
    assert parse_stream_interval(str(interval)) == interval or interval.off


@pytest.mark.parametrize("text", ["-1", "4.5", "abc", "20s", "ms", "-5ms", "nanms", str(MAX_TOKENS + 1), "20000ms", ""])
def test_a_bad_interval_is_refused_saying_what_is_accepted(text):
    with pytest.raises(ValueError, match="tokens .* milliseconds .* or off"):
        parse_stream_interval(text)


def test_due_sends_the_first_token_at_once_then_by_count_or_time():
    by_count, by_time = StreamInterval(tokens=4), StreamInterval(seconds=0.02)
    assert by_count.due(1, None) and by_time.due(1, None)
    assert not by_count.due(3, 10.0) and by_count.due(4, 0.0)
    assert not by_time.due(100, 0.01) and by_time.due(1, 0.02)
    assert StreamInterval().off and StreamInterval().due(1, 0.0)


def _tokens(*ids: int) -> tuple[int, NewTokens]:
    return 0, NewTokens(tuple(ids))


async def _drain(pacer: Pacer, until) -> list:
    """Items from the pacer until `until(item)` is true (that one included)."""
    items = []
    while not items or not until(items[-1]):
        items.append(await asyncio.wait_for(pacer.next(), WAIT_S))
    return items


def _feed_one_by_one(pacer: Pacer, items: list) -> asyncio.Task:
    async def feed():
        for item in items:
            pacer.put(item)
            await asyncio.sleep(0)  # the reader runs between puts (it may still find several waiting)

    return asyncio.ensure_future(feed())


def test_tokens_are_held_until_the_count_and_the_end_sends_the_rest():
    async def main():
        observed = []
        pacer = Pacer(StreamInterval(tokens=4), lambda i, e: observed.append(e))
        items = [_tokens(k) for k in range(1, 15)] + [(0, Done(None, 0, 0))]
        feeder = _feed_one_by_one(pacer, items)
        out = await _drain(pacer, lambda item: isinstance(item[1], (Done, Ending)))
        await feeder
        return out, observed

    out, observed = asyncio.run(main())
    sent = [event.token_ids for _, event in out[:-1]]
    last = out[-1][1].tokens.token_ids if isinstance(out[-1][1], Ending) else ()  # what was held at the end
    assert [t for ids in sent for t in ids] + list(last) == list(range(1, 15))
    assert sent[0] == (1,)  # the first at once
    assert all(len(ids) >= 4 for ids in sent[1:])
    assert [t for e in observed if isinstance(e, NewTokens) for t in e.token_ids] == list(range(1, 15))


def test_held_tokens_go_out_when_their_time_passes_without_another_event():
    async def main():
        pacer = Pacer(StreamInterval(seconds=0.05), lambda i, e: None)
        pacer.put(_tokens(1))
        first = await asyncio.wait_for(pacer.next(), WAIT_S)
        pacer.put(_tokens(2))
        pacer.put(_tokens(3))
        later = await _drain(pacer, lambda item: item[1].token_ids[-1] == 3)  # nothing more is put
        return first, later

    first, later = asyncio.run(main())
    assert first[1].token_ids == (1,)
    assert [t for _, e in later for t in e.token_ids] == [2, 3]


def test_any_other_event_sends_the_held_tokens_before_it_and_the_end_with_it():
    async def main():
        pacer = Pacer(StreamInterval(tokens=MAX_TOKENS), lambda i, e: None)
        for item in (_tokens(1), _tokens(2), (0, Milestone("departed", {})), _tokens(3), (0, Done(None, 0, 0))):
            pacer.put(item)
            await asyncio.sleep(0)
        return await _drain(pacer, lambda item: isinstance(item[1], Ending))

    out = asyncio.run(main())
    milestone = next(k for k, (_, e) in enumerate(out) if isinstance(e, Milestone))
    assert [t for _, e in out[:milestone] for t in e.token_ids] == [1, 2]
    assert milestone == len(out) - 2 and out[-1][1].tokens.token_ids == (3,)  # the end takes what is held


def test_an_exception_ending_the_request_sends_every_samples_held_tokens_first():
    async def main():
        pacer = Pacer(StreamInterval(tokens=MAX_TOKENS), lambda i, e: None)
        for item in ((0, NewTokens((1,))), (1, NewTokens((10,))), (0, NewTokens((2,))), (1, NewTokens((11,))),
                     asyncio.CancelledError()):
            pacer.put(item)
            await asyncio.sleep(0)
        return await _drain(pacer, lambda item: isinstance(item, BaseException))

    out = asyncio.run(main())
    assert isinstance(out[-1], asyncio.CancelledError)
    per_sample = {i: [t for j, e in out[:-1] if j == i for t in e.token_ids] for i in (0, 1)}
    assert per_sample == {0: [1, 2], 1: [10, 11]}


def test_off_hands_each_event_over_as_it_comes():
    async def main():
        out = []
        pacer = Pacer(StreamInterval(), lambda i, e: None)
        for k in range(1, 5):
            pacer.put(_tokens(k))
            out.append(await asyncio.wait_for(pacer.next(), WAIT_S))
        return out

    assert [e.token_ids for _, e in asyncio.run(main())] == [(1,), (2,), (3,), (4,)]


def test_tokens_waiting_for_the_door_go_as_one_message_and_held_ones_never_wake_it():
    async def main():
        joined_off = Pacer(StreamInterval(), lambda i, e: None)
        for item in (_tokens(1), _tokens(2), (1, NewTokens((10,))), _tokens(3)):
            joined_off.put(item)  # the door is away: they wait
        off = [await asyncio.wait_for(joined_off.next(), WAIT_S) for _ in range(3)]
        by_count = Pacer(StreamInterval(tokens=4), lambda i, e: None)
        for item in (_tokens(1), _tokens(2), _tokens(3)):
            by_count.put(item)
        first = await asyncio.wait_for(by_count.next(), WAIT_S)
        held = asyncio.ensure_future(by_count.next())
        await asyncio.sleep(0.05)  # nothing more is put: nothing is due, whatever the wait
        waiting = not held.done()
        by_count.put(_tokens(4))
        by_count.put(_tokens(5))
        return off, first, waiting, await asyncio.wait_for(held, WAIT_S)

    off, first, waiting, due = asyncio.run(main())
    assert off == [_tokens(1, 2), (1, NewTokens((10,))), _tokens(3)]
    assert first == _tokens(1) and waiting and due == _tokens(2, 3, 4, 5)
