"""Runs an Engine on its own thread and bridges it to asyncio.

    event loop (gRPC handlers)            engine thread
    ---------------------------            -------------
    call(fn) -------- command queue ---->  fn(engine) between two steps
    stream(rid) <---- call_soon_threadsafe  step() results, per request

The scheduler is single-threaded by design: every mutation (add, abort, finish, hand-over of
KV) runs on the engine thread between steps, through `call`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from pdserve.engine.engine import Engine
from pdserve.engine.outputs import StepResult
from pdserve.kv import BlockHold

T = TypeVar("T")
log = logging.getLogger(__name__)
StepListener = Callable[[StepResult], None]


class AsyncEngine:
    def __init__(self, engine: Engine, idle_wait_s: float = 0.05):
        self.engine = engine
        self._commands: queue.SimpleQueue[tuple[Callable[[Engine], object], Future]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle_wait_s = idle_wait_s
        self._listeners: list[StepListener] = []
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stats = engine.scheduler.stats()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def add_listener(self, listener: StepListener) -> None:
        """`listener(result)` runs on the event loop after every step that did something."""
        self._listeners.append(listener)

    async def call(self, fn: Callable[[Engine], T]) -> T:
        """Run fn(engine) on the engine thread between steps; its exception is raised here."""
        future: Future = Future()
        self._commands.put((fn, future))
        self._wake.set()
        return await asyncio.wrap_future(future)

    def call_nowait(self, fn: Callable[[Engine], object]) -> None:
        self._commands.put((fn, Future()))
        self._wake.set()

    def release_nowait(self, hold: BlockHold) -> None:
        """Give a block hold back to the engine between steps, without waiting."""
        self.call_nowait(lambda e: e.release(hold))

    @property
    def stats(self):
        """The scheduler's statistics as of the end of the last step or command (never waits for
        a step: placement and health must not stall behind a long prefill)."""
        return self._stats

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain_commands()
            self._stats = self.engine.scheduler.stats()
            if not self.engine.has_unfinished():
                self._wake.wait(self._idle_wait_s)
                self._wake.clear()
                continue
            try:
                result = self.engine.step()
            except Exception:  # a bug must not kill the worker silently
                log.exception("engine step failed")
                raise
            self._stats = self.engine.scheduler.stats()
            if not result.is_idle or result.holds:
                self._publish(result)

    def _drain_commands(self) -> None:
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(self.engine))
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

    def _publish(self, result: StepResult) -> None:
        assert self._loop is not None
        for listener in self._listeners:
            self._loop.call_soon_threadsafe(listener, result)
