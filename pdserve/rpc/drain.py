"""Graceful drain on SIGTERM: stop taking work, let work in flight finish, then stop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from pdserve.rpc.errors import Unavailable


class Drain:
    def __init__(self) -> None:
        self.draining = False

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise Unavailable("this server is draining; retry on another one")

    async def wait_idle(self, in_flight: Callable[[], int], timeout_s: float, poll_s: float = 0.1) -> int:
        """Set draining, then wait until nothing is in flight or the timeout passes; returns
        what is still in flight."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(poll_s)
        return in_flight()
