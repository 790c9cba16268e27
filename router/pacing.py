"""A request's events on their way to its door, paced by the stream interval
(router/stream_interval.py): the mechanism that holds tokens and lets them go.

    the flow (or each sample's)             Pacer.next()                          the gateway
      (index, event) | exception  ──▶  token events of a sample waiting together    ──▶  an output
                                       joined (pdserve/coalescing.py), `observe`d       per item
                                       as they arrive, then held per sample until
                                       the interval says due (a timer for Tms);
                                       its Done takes the held tokens along (one
                                       Ending); anything else sends them first
                                       (an exception: every sample's)

Work is per arrival and per message, never per token: a step's tokens come as one event and go
out as one message at most.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.coalescing import NOTHING, joined_tokens, merged_with_waiting
from router.flow_types import Done, NewTokens
from router.stream_interval import StreamInterval

Item = tuple[int, object] | BaseException  # (sample index, event), or what ended the whole request


@dataclass(frozen=True)
class Ending:
    """A sample's last tokens and its end, to go out as one message."""

    tokens: NewTokens
    done: Done


class _Held:
    """One sample's tokens not sent yet."""

    def __init__(self, interval: StreamInterval):
        self.interval = interval
        self.event: NewTokens | None = None
        self.sent_at: float | None = None  # loop time of its last message (None: none yet)

    def add(self, event: NewTokens, now: float) -> list[NewTokens]:
        """What goes out now that `event` came: nothing, the held tokens, or (one that cannot
        join them) both in order."""
        out = []
        joined = event if self.event is None else joined_tokens(self.event, event)
        if joined is None:
            out.append(self.take(now))
            joined = event
        self.event = joined
        if self.interval.due(len(joined.token_ids), None if self.sent_at is None else now - self.sent_at):
            out.append(self.take(now))
        return out

    def take(self, now: float) -> NewTokens:
        event, self.event, self.sent_at = self.event, None, now
        assert event is not None
        return event

    @property
    def deadline(self) -> float | None:
        if self.event is None or self.sent_at is None or not self.interval.seconds:
            return None
        return self.sent_at + self.interval.seconds


class Pacer:
    """Reads a request's queue of items: `next()` is the next to send. `observe(index, event)`
    sees each event (never an exception, nor a sample's end, None) once, when it arrives."""

    def __init__(self, queue: asyncio.Queue, interval: StreamInterval, observe: Callable[[int, object], None]):
        self._queue = queue
        self._interval = interval
        self._clock = asyncio.get_running_loop().time
        self._observe = observe
        self._held: dict[int, _Held] = {}
        self._ready: deque[Item] = deque()
        self._next: object = NOTHING  # read while joining, not joined: taken next

    async def next(self) -> Item:
        while not self._ready:
            item = await self._arrival()
            if item is NOTHING:
                self._send_due(self._clock())
            else:
                self._take(item)
        return self._ready.popleft()

    async def _arrival(self) -> object:
        """The next item (a sample's token events waiting together joined), or NOTHING when held
        tokens fell due first."""
        if self._next is not NOTHING:
            item, self._next = self._next, NOTHING
            return item
        if self._queue.empty():
            deadline = min((d for h in self._held.values() if (d := h.deadline) is not None), default=None)
            if deadline is not None:
                try:
                    async with asyncio.timeout_at(deadline):
                        item = await self._queue.get()
                except TimeoutError:
                    return NOTHING
            else:
                item = await self._queue.get()
        else:
            item = self._queue.get_nowait()
        if _is_tokens(item):
            item, self._next = merged_with_waiting(item, self._queue, _joined)
        return item

    def _take(self, item: object) -> None:
        if isinstance(item, BaseException):
            for index in list(self._held):
                self._send_held(index, self._clock())
            self._ready.append(item)
            return
        index, event = item
        if event is not None and not isinstance(event, BaseException):
            self._observe(index, event)
        if isinstance(event, NewTokens):
            if self._interval.off:
                self._ready.append(item)
            else:
                self._ready.extend((index, e) for e in self._holder(index).add(event, self._clock()))
            return
        now = self._clock()
        tokens = self._take_held(index, now)
        if tokens is not None and isinstance(event, Done):
            self._ready.append((index, Ending(tokens, event)))
            return
        if tokens is not None:
            self._ready.append((index, tokens))
        self._ready.append(item)

    def _holder(self, index: int) -> _Held:
        held = self._held.get(index)
        if held is None:
            held = self._held[index] = _Held(self._interval)
        return held

    def _take_held(self, index: int, now: float) -> NewTokens | None:
        held = self._held.get(index)
        return held.take(now) if held is not None and held.event is not None else None

    def _send_held(self, index: int, now: float) -> None:
        if (tokens := self._take_held(index, now)) is not None:
            self._ready.append((index, tokens))

    def _send_due(self, now: float) -> None:
        for index, held in self._held.items():
            if (deadline := held.deadline) is not None and deadline <= now:
                self._ready.append((index, held.take(now)))


def _is_tokens(item: object) -> bool:
    return isinstance(item, tuple) and isinstance(item[1], NewTokens)


def _joined(first: tuple[int, NewTokens], item: object) -> tuple[int, NewTokens] | None:
    """Two token events of one sample as one (None: `item` is anything else)."""
    if not _is_tokens(item) or item[0] != first[0]:
        return None
    joined = joined_tokens(first[1], item[1])
    return None if joined is None else (first[0], joined)
