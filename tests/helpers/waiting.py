"""Waiting on a condition instead of sleeping: poll it until it holds or a deadline passes.

    wait_until(lambda: stats().blocks_active == 0, 30, "the decode worker frees its blocks")
    spans = wait_for(lambda: spans_named("pdserve.decode") or None, 20, "a decode span")

A predicate that raises counts as not yet (a server still starting refuses connections); the
last exception is quoted when the deadline passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold before the deadline."""


def wait_for(probe: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """The first truthy value of `probe()`, polled every `interval_s`; WaitTimeout after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - quoted below
            last_error = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(_message(what, timeout_s, last_error))
        time.sleep(interval_s)


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Return once `predicate()` is true; WaitTimeout naming `what` after `timeout_s`."""
    wait_for(lambda: bool(predicate()), timeout_s, what, interval_s)


async def async_wait_until(predicate: Callable[[], object | Awaitable[object]], timeout_s: float, what: str,
                           interval_s: float = 0.01) -> None:
    """`wait_until` on the event loop: the loop runs between polls; `predicate` may be async."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
            if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
                value = await value
            if value:
                return
        except Exception as exc:  # noqa: BLE001 - quoted below
            last_error = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(_message(what, timeout_s, last_error))
        await asyncio.sleep(interval_s)


def _message(what: str, timeout_s: float, error: Exception | None) -> str:
    tail = f" (last error: {error!r})" if error is not None else ""
    return f"timed out after {timeout_s:g} s waiting for: {what}{tail}"
