"""Engine commands that must happen even if the task asking for them is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.engine import Engine
from pdserve.errors import EngineFailed

T = TypeVar("T")


def submit(engine: AsyncEngine, fn: Callable[[Engine], T]) -> asyncio.Future[T]:
    """Queue fn(engine) now, in order with every command queued before and after it.

    Unlike `AsyncEngine.call`, nothing withdraws the command once queued: a caller cancelled
    while it waits (a stream's cleanup during a cancel) leaves the command to run all the same.
    The returned future resolves on this loop with fn's result or exception (EngineFailed at
    once when the engine is not running).
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    if engine.failed:
        done.set_exception(EngineFailed("the engine of this worker is not running"))
        done.exception()
        return done

    def run(e: Engine) -> None:
        try:
            value = fn(e)
        except BaseException as exc:
            loop.call_soon_threadsafe(_settle, done, exc, None)
            raise
        loop.call_soon_threadsafe(_settle, done, None, value)

    engine.call_nowait(run)
    return done


def _settle(future: asyncio.Future, error: BaseException | None, value: object) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
        future.exception()
    else:
        future.set_result(value)
