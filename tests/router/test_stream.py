"""router/flow/stream.py's Pumped gathering a decode call's token events: its reader wakes once N
tokens wait, with each event's arrival; anything else lets them go first, in order; a periodic
check leaves them gathered; a cancelled reader takes them. Token events taken directly go to the
taker only while the reader waits with nothing queued before them: every other event still comes
to the reader after the tokens that preceded it."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.requests import FinishReason
from pdserve.worker.events import Finished, Preempted, Tokens
from router.fleet.clients import FaultKind, PushCall, Sink, WorkerFault
from router.flow.stream import Gathered, Pumped

pytestmark = pytest.mark.timeout(30)


class _Pushed(PushCall):
    def start(self, sink: Sink) -> None:
        self.sink = sink

    def close(self) -> None:
        pass


def _pumped(gather: int) -> tuple[Pumped, Sink]:
    call = _Pushed()
    pumped = Pumped(call, "d0")
    pumped.gather(gather)
    return pumped, call.sink


def _woken(pumped: Pumped) -> bool:
    """Whether a reader waiting now would have something to take (run on a loop)."""
    return bool(pumped._items)


def test_token_events_wake_the_reader_once_n_tokens_wait():
    async def main():
        pumped, sink = _pumped(4)
        sink.deliver(Tokens((1,)))
        sink.deliver(Tokens((2, 3)))
        assert not _woken(pumped)
        sink.deliver(Tokens((4,)))
        got = await pumped.next()
        assert isinstance(got, Gathered) and got.tokens.token_ids == (1, 2, 3, 4)
        assert [n for _, n in got.arrived] == [1, 2, 1]
        assert [at for at, _ in got.arrived] == sorted(at for at, _ in got.arrived)

    asyncio.run(main())


def test_anything_else_lets_the_gathered_tokens_go_first():
    async def main():
        pumped, sink = _pumped(4)
        sink.deliver(Tokens((1,)))
        sink.deliver(Preempted("recompute", "memory", "preempted"))
        sink.deliver(Tokens((2,)))
        sink.deliver(Finished(FinishReason.LENGTH, 0, 0))
        sink.end()
        got = [await pumped.next() for _ in range(4)]
        assert got[0].tokens.token_ids == (1,) and isinstance(got[1], Preempted)
        assert got[2].tokens.token_ids == (2,) and isinstance(got[3], Finished)
        with pytest.raises(StopAsyncIteration):
            await pumped.next()

    asyncio.run(main())


def test_a_fault_comes_after_the_gathered_tokens():
    async def main():
        pumped, sink = _pumped(8)
        sink.deliver(Tokens((1, 2)))
        sink.fail(WorkerFault(FaultKind.GONE, "d0", "gone"))
        assert (await pumped.next()).tokens.token_ids == (1, 2)
        with pytest.raises(WorkerFault):
            await pumped.next()

    asyncio.run(main())


def test_the_periodic_check_leaves_them_gathered_and_a_cancelled_reader_takes_them():
    async def main():
        pumped, sink = _pumped(4)
        sink.deliver(Tokens((1,)))
        assert await pumped.next_within(0.01) is None
        sink.deliver(Tokens((2,)))
        reader = asyncio.ensure_future(pumped.next_within(10))
        await asyncio.sleep(0)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert pumped.gathered().tokens.token_ids == (1, 2)
        assert pumped.gathered() is None
        pumped.close()

    asyncio.run(main())


def test_a_first_token_with_prompt_logprobs_is_never_gathered():
    async def main():
        pumped, sink = _pumped(4)
        first = Tokens((1,), (), ("prompt",))
        sink.deliver(first)
        assert await pumped.next() is first

    asyncio.run(main())


async def _reader_waiting(pumped: Pumped) -> asyncio.Task:
    """A reader waiting on `pumped`, its wait begun."""
    task = asyncio.ensure_future(pumped.next())
    for _ in range(3):
        await asyncio.sleep(0)
    return task


@pytest.mark.parametrize("gather", [0, 2])
def test_tokens_go_to_the_taker_while_the_reader_waits_and_the_rest_to_the_reader_in_order(gather):
    async def main():
        pumped, sink = _pumped(gather)
        taken: list = []
        pumped.take_directly(lambda e: taken.append(e) or True)
        reader = await _reader_waiting(pumped)
        sink.deliver(Tokens((2,)))
        sink.deliver(Tokens((3,)))
        assert [e.token_ids if isinstance(e, Tokens) else e.tokens.token_ids for e in taken] == \
            ([(2,), (3,)] if not gather else [(2, 3)])
        assert not reader.done()
        sink.deliver(Preempted("recompute", "memory", "preempted"))  # the reader's: it wakes
        sink.deliver(Tokens((4,)))  # queued behind it (gathered: held for the next)
        assert await reader == Preempted("recompute", "memory", "preempted")
        assert len(taken) == (2 if not gather else 1)
        if not gather:
            assert await pumped.next() == Tokens((4,))

    asyncio.run(main())


def test_tokens_are_queued_while_nobody_waits():
    async def main():
        pumped, sink = _pumped(0)
        taken: list = []
        pumped.take_directly(lambda e: taken.append(e) or True)
        sink.deliver(Tokens((1,)))
        assert not taken and await pumped.next() == Tokens((1,))

    asyncio.run(main())


def test_a_taker_that_leaves_a_token_event_leaves_it_to_the_reader():
    async def main():
        pumped, sink = _pumped(0)
        pumped.take_directly(lambda e: False)
        reader = await _reader_waiting(pumped)
        sink.deliver(Tokens((7,)))
        assert await reader == Tokens((7,))

    asyncio.run(main())


def test_ids_alone_gather_as_token_events_do_and_join_with_them_in_order():
    async def main():
        pumped, sink = _pumped(4)
        sink.deliver_tokens((1,))
        sink.deliver_tokens((2, 3))
        assert not _woken(pumped)
        sink.deliver_tokens((4,))
        got = await pumped.next()
        assert got.tokens == Tokens((1, 2, 3, 4)) and [n for _, n in got.arrived] == [1, 2, 1]
        sink.deliver_tokens((5,))  # ids alone, then an event of the same kind: one run, in order
        sink.deliver(Tokens((6,)))
        sink.deliver_tokens((7, 8))
        got = await pumped.next()
        assert got.tokens == Tokens((5, 6, 7, 8))

    asyncio.run(main())


def test_ids_alone_not_gathered_come_as_a_token_event():
    async def main():
        pumped, sink = _pumped(0)
        sink.deliver_tokens((9, 10))
        assert await pumped.next() == Tokens((9, 10))

    asyncio.run(main())
