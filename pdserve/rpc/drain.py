"""Graceful drain on SIGTERM: stop taking work, let work in flight finish, then stop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from pdserve.rpc.errors import Unavailable


class Drain:
    def __init__(self) -> None:
        self.draining = False
        self._on_drain: list[Callable[[], None]] = []
        self._on_stop: list[Callable[[], None]] = []

    def on_drain(self, begin: Callable[[], None]) -> None:
        """`begin()` runs once, as the drain begins (a decode worker tells its routers' feeds)."""
        self._on_drain.append(begin)

    def on_stop(self, end: Callable[[], None]) -> None:
        """`end()` runs as the server stops, before it waits for its calls: for streams that carry
        no work of their own and would hold the stop's grace to its end (a router's event feed)."""
        self._on_stop.append(end)

    def stopping(self) -> None:
        for end in self._on_stop:
            end()

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise Unavailable("this server is draining; retry on another one")

    async def wait_idle(self, in_flight: Callable[[], int], timeout_s: float, poll_s: float = 0.1) -> int:
        """Set draining, then wait until nothing is in flight or the timeout passes; returns
        what is still in flight."""
        if not self.draining:
            self.draining = True
            for begin in self._on_drain:
                begin()
        deadline = time.monotonic() + timeout_s
        while in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(poll_s)
        return in_flight()
