"""A worker call read in the background, so that its failure is seen even while nobody reads it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from router.clients import Call, WorkerFault

T = TypeVar("T")
_END = object()


class Pumped:
    """Events of `call` in arrival order; a fault comes after the events that preceded it."""

    def __init__(self, call: Call, address: str):
        self.call = call
        self.address = address
        self.failed = asyncio.Event()
        self.fault: WorkerFault | None = None  # set when the call failed
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        try:
            while True:
                self._queue.put_nowait(await self.call.next())
        except StopAsyncIteration:
            self._queue.put_nowait(_END)
        except WorkerFault as fault:
            self.fault = fault
            self._queue.put_nowait(fault)
            self.failed.set()

    async def next(self) -> object:
        return self._taken(await self._queue.get())

    async def next_within(self, timeout_s: float) -> object | None:
        """`next`, or None after `timeout_s` without an event. An event already queued is taken
        without arming a timer (this runs for every relayed token)."""
        if not self._queue.empty():
            return self._taken(self._queue.get_nowait())
        try:  # asyncio.timeout, not wait_for: wait_for can swallow a cancel (an Abort) that meets its result
            async with asyncio.timeout(timeout_s):
                return self._taken(await self._queue.get())
        except TimeoutError:
            return None

    def _taken(self, item: object) -> object:
        if item is _END:
            self._queue.put_nowait(_END)
            raise StopAsyncIteration
        if isinstance(item, WorkerFault):
            self._queue.put_nowait(item)
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
        self._task.cancel()
        self.call.close()
