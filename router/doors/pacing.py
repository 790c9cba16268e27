"""A request's events on their way to its door, paced by the stream interval
(router/doors/stream_interval.py): the mechanism that holds tokens and lets them go.

    the flow (or each sample's)  Pacer.put(item)                               Pacer.next()   the gateway
      (index, event) | exception  ──▶  `observe`d as it arrives; a sample's    ──▶ the items     ──▶  an output
                                       tokens held until the interval says due     due, a sample's    per item
                                       (a timer for Tms); its Done takes the       tokens waiting
                                       held tokens along (one Ending); anything    together joined
                                       else sends them first (an exception:
                                       every sample's)

The door's task wakes only when something is due: held tokens cost their producer a join, not a
hop to the door. Work is per arrival and per message, never per token: a step's tokens come as
one event and go out as one message at most.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.coalescing import joined_run
from router.doors.stream_interval import StreamInterval
from router.flow.flow_types import Done, NewTokens

Item = tuple[int, object] | BaseException  # (sample index, event), or what ended the whole request


@dataclass(frozen=True)
class Ending:
    """A sample's last tokens and its end, to go out as one message."""

    tokens: NewTokens
    done: Done


class _Held:
    """One sample's tokens not sent yet: the events, joined when they go."""

    def __init__(self, interval: StreamInterval):
        self.interval = interval
        self.events: list[NewTokens] = []
        self.count = 0
        self.sent_at: float | None = None  # loop time of its last message (None: none yet)

    def add(self, event: NewTokens, now: float) -> list[NewTokens]:
        """What goes out now that `event` came: nothing, the held tokens, or (one that cannot
        join them: a first token's prompt log-probabilities) both in order."""
        out = []
        if self.events and event.prompt_logprobs:
            out.append(self.take(now))
        self.events.append(event)
        self.count += len(event.token_ids)
        if self.interval.due(self.count, None if self.sent_at is None else now - self.sent_at):
            out.append(self.take(now))
        return out

    def take(self, now: float) -> NewTokens:
        events, self.events, self.count, self.sent_at = self.events, [], 0, now
        return joined_run(events)

    @property
    def deadline(self) -> float | None:
        if not self.events or self.sent_at is None or not self.interval.seconds:
            return None
        return self.sent_at + self.interval.seconds


class Pacer:
    """A request's items: its flows `put` them, the door awaits `next()`, the next to send.
    `observe(index, event)` sees each event (never an exception, nor a sample's end, None) once,
    when it arrives."""

    def __init__(self, interval: StreamInterval, observe: Callable[[int, object], None]):
        self._interval = interval
        self._loop = asyncio.get_running_loop()
        self._observe = observe
        self._held: dict[int, _Held] = {}
        self._ready: deque[Item] = deque()
        self._waiter: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None

    def put(self, item: Item) -> None:
        self._take(item)
        if self._interval.seconds:
            self._arm()
        self._wake()

    async def next(self) -> Item:
        while not self._ready:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._ready.popleft()
        if _is_tokens(item):  # a sample's tokens waiting together go as one message
            joined = [item[1]]
            while self._ready and _is_tokens(nxt := self._ready[0]) and nxt[0] == item[0] and not nxt[1].prompt_logprobs:
                joined.append(self._ready.popleft()[1])
            item = (item[0], joined_run(joined))
        return item

    def _wake(self) -> None:
        if self._ready and self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _take(self, item: Item) -> None:
        if isinstance(item, BaseException):
            for index in list(self._held):
                self._send_held(index, self._loop.time())
            self._ready.append(item)
            return
        index, event = item
        if event is not None and not isinstance(event, BaseException):
            self._observe(index, event)
        if isinstance(event, NewTokens):
            if self._interval.off:
                self._ready.append(item)
            else:
                self._ready.extend((index, e) for e in self._holder(index).add(event, self._loop.time()))
            return
        now = self._loop.time()
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
        return held.take(now) if held is not None and held.events else None

    def _send_held(self, index: int, now: float) -> None:
        if (tokens := self._take_held(index, now)) is not None:
            self._ready.append((index, tokens))

    def _arm(self) -> None:
        """A timer for the earliest held tokens' time (Tms), unless one is set for it already."""
        deadline = min((d for h in self._held.values() if (d := h.deadline) is not None), default=None)
        if self._timer is not None and deadline != self._timer_at:
            self._timer.cancel()
            self._timer = None
        if deadline is not None and self._timer is None:
            self._timer, self._timer_at = self._loop.call_at(deadline, self._due), deadline

    def _due(self) -> None:
        self._timer = None
        now = self._loop.time()
        for index, held in self._held.items():
            if (deadline := held.deadline) is not None and deadline <= now:
                self._ready.append((index, held.take(now)))
        self._arm()
        self._wake()


def _is_tokens(item: object) -> bool:
    return isinstance(item, tuple) and isinstance(item[1], NewTokens)


