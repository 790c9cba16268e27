"""A worker call read in the background, so that its failure is seen even while nobody reads it
(a PushCall, whose events its feed hands over as they come, needs no reader: this is its sink)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable
from typing import TypeVar

from router.fleet.clients import Call, PushCall, WorkerFault

T = TypeVar("T")
_END = object()
_CHECK = object()  # next_within's period passed


class Pumped:
    """Events of `call` in arrival order; a fault comes after the events that preceded it.
    NOTE: one reader at a time (the request's flow)."""

    def __init__(self, call: Call | PushCall, address: str):
        self.call = call
        self.address = address
        self.failed = asyncio.Event()
        self.fault: WorkerFault | None = None  # set when the call failed
        self._items: deque = deque()
        self._waiter: asyncio.Future | None = None  # its reader's, while it waits
        self._task: asyncio.Future | None = None
        self._check: asyncio.TimerHandle | None = None  # next_within's period, while one runs
        if isinstance(call, PushCall):
            call.start(self)
        else:
            self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        assert isinstance(self.call, Call)
        try:
            while True:
                self.deliver(await self.call.next())
        except StopAsyncIteration:
            self.end()
        except WorkerFault as fault:
            self.fail(fault)

    # ---- the sink (router/fleet/clients.py Sink) ----

    def deliver(self, event: object) -> None:
        self._put(event)

    def end(self) -> None:
        self._put(_END)

    def fail(self, fault: WorkerFault) -> None:
        self.fault = fault
        self._put(fault)
        self.failed.set()

    async def next(self) -> object:
        while (item := await self._get()) is _CHECK:
            self._check = None
        return self._taken(item)

    async def next_within(self, period_s: float) -> object | None:
        """`next`, or None once every `period_s` at least (the caller's periodic check): one
        timer a period, not one a wait (this runs for every relayed token)."""
        if self._check is None:
            self._check = asyncio.get_running_loop().call_later(period_s, self._put, _CHECK)
        item = await self._get()
        if item is _CHECK:
            self._check = None
            return None
        return self._taken(item)

    def _put(self, item: object) -> None:
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _get(self) -> object:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def _taken(self, item: object) -> object:
        """The end and a fault stay: every later read meets them again."""
        if item is _END:
            self._items.appendleft(_END)
            raise StopAsyncIteration
        if isinstance(item, WorkerFault):
            self._items.appendleft(item)
            raise item
        return item

    async def unless_failed(self, other: Awaitable[T]) -> T:
        """Await `other`, unless this call fails first: then raise its fault (`other` is cancelled)."""
        task = asyncio.ensure_future(other)
        watch = asyncio.ensure_future(self.failed.wait())
        try:
            await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not task.done():
                task.cancel()
        if task.done() and not task.cancelled():
            return task.result()
        assert self.fault is not None
        raise self.fault

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._check is not None:
            self._check.cancel()
        self.call.close()
