"""Runs an Engine on its own thread and bridges it to asyncio.

    event loop (gRPC handlers)            engine thread
    ---------------------------            -------------
    call(fn) -------- command queue ---->  fn(engine) between two steps
    query(fn) ------- a thread, under engine.lock: read-only, during a forward pass too
    stream(rid) <---- call_soon_threadsafe  step() results, per request (reservations as
                                            soon as they are allocated, before the forward)

The scheduler is single-threaded by design: every mutation (add, abort, finish, hand-over of
KV) runs on the engine thread between steps, through `call`. The engine thread holds the
engine's lock while it changes the scheduler's state and releases it for the forward pass, so
a `query` (the router's prefix probe) waits for a scheduling decision, never for the model.

Failure is loud. A RequestFault in a step aborts that request only (request fault listeners
hear of it). Any other exception in a step ends the engine thread: every pending and later
`call` raises EngineFailed at once, and the failure listeners run, once, on the event loop.
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
from pdserve.errors import EngineFailed
from pdserve.engine.faults import FaultInjector, NoFaults, RequestFault
from pdserve.engine.outputs import StepResult
from pdserve.engine.step_meter import StepMeter, StepRates
from pdserve.kv import BlockHold
from pdserve.scheduler.results import Reservation

T = TypeVar("T")
log = logging.getLogger(__name__)
StepListener = Callable[[StepResult], None]
FailureListener = Callable[[BaseException], None]
RequestFaultListener = Callable[[RequestFault], None]


class AsyncEngine:
    def __init__(self, engine: Engine, idle_wait_s: float = 0.05, faults: FaultInjector = NoFaults()):
        self.engine = engine
        self._commands: queue.SimpleQueue[tuple[Callable[[Engine], object], Future]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle_wait_s = idle_wait_s
        self._faults = faults
        self._listeners: list[StepListener] = []
        self._failure_listeners: list[FailureListener] = []
        self._fault_listeners: list[RequestFaultListener] = []
        self._ended: str | None = None  # why calls fail, once the engine thread is over
        self._fatal: BaseException | None = None
        self._fatal_lock = threading.Lock()  # each failure listener hears of the failure once
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stats = engine.scheduler.stats()
        self._meter = StepMeter(engine.scheduler.cfg.preemption.prefill_tokens_per_s)

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

    def add_failure_listener(self, listener: FailureListener) -> None:
        """`listener(exc)` runs once, on the event loop, after the engine thread died of `exc`;
        by then every pending `call` has raised EngineFailed, and every later one does. Added
        after the failure, it runs at once (on the loop)."""
        with self._fatal_lock:
            self._failure_listeners.append(listener)
            fatal = self._fatal
        if fatal is not None:
            self._announce([listener], fatal)

    def add_request_fault_listener(self, listener: RequestFaultListener) -> None:
        """`listener(fault)` runs on the event loop after a step failed because of one request:
        the engine has aborted it (its holds went out in a StepResult to the step listeners)."""
        self._fault_listeners.append(listener)

    @property
    def failed(self) -> bool:
        """True once the engine thread is over (a fatal fault or stop): calls fail at once."""
        return self._ended is not None

    async def call(self, fn: Callable[[Engine], T]) -> T:
        """Run fn(engine) on the engine thread between steps; its exception is raised here.
        Raises EngineFailed when the engine thread is over or ends before fn ran."""
        if self._ended is not None:
            raise EngineFailed(self._ended)
        future: Future = Future()
        self._commands.put((fn, future))
        self._wake.set()
        if self._ended is not None:
            self._fail_pending()
        return await asyncio.wrap_future(future)

    async def query(self, fn: Callable[[Engine], T]) -> T:
        """Run a read-only fn(engine) now, on a thread of its own under the engine's lock: it
        waits at most for a scheduling decision in progress, never for a forward pass (unlike
        `call`, which waits for the step to end). fn must not change the engine."""
        if self._ended is not None:
            raise EngineFailed(self._ended)

        def locked() -> T:
            with self.engine.lock:
                return fn(self.engine)

        return await asyncio.to_thread(locked)

    def call_nowait(self, fn: Callable[[Engine], object]) -> None:
        """Queue fn(engine) without waiting; dropped once the engine thread is over."""
        if self._ended is None:
            self._commands.put((fn, Future()))
            self._wake.set()

    def release_nowait(self, hold: BlockHold) -> None:
        """Give a block hold back to the engine between steps, without waiting."""
        self.call_nowait(lambda e: e.release(hold))

    @property
    def stats(self):
        """The scheduler's statistics as of the last scheduling decision or the end of the last
        step (while nothing is left to step: of the last command). Never waits for a step:
        placement and health must not stall behind a long prefill. Never taken between a
        command and the next decision: a request just added counts as waiting only once a
        decision left it queued (routers rebalance where requests wait: router/placement/rebalancing.py)."""
        return self._stats

    @property
    def rates(self) -> StepRates:
        """How fast the last seconds' steps went (pdserve/engine/step_meter.py); never waits."""
        return self._meter.rates

    async def queued_prefill_tokens(self) -> int:
        """Prompt tokens still to compute here (Scheduler.queued_prefill_tokens), read under the
        engine's lock: it waits for a scheduling decision at most, never for a forward pass. 0
        once the engine thread is over (nothing more is computed here)."""
        try:
            return await self.query(lambda e: e.scheduler.queued_prefill_tokens())
        except EngineFailed:
            return 0

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._tick()
        except BaseException as exc:
            log.exception("engine step failed; this engine serves nothing more")
            self._end(f"the engine failed: {exc!r}")
            with self._fatal_lock:
                self._fatal = exc
                listeners = list(self._failure_listeners)
            self._announce(listeners, exc)
            return
        self._end("the engine was stopped")

    def _tick(self) -> None:
        self._drain_commands()
        if not self.engine.has_unfinished():
            self._stats = self.engine.scheduler.stats()  # nothing queued: what the commands changed
            self._wake.wait(self._idle_wait_s)
            self._wake.clear()
            return
        result = self._step()
        self._meter.record(result.num_tokens, len(result.chunks), result.seconds)
        self._stats = self.engine.scheduler.stats()
        if not result.is_idle or result.holds:
            self._publish(result)

    def _step(self) -> StepResult:
        """One engine step; a RequestFault aborts its request and yields what the abort freed."""
        try:
            self._faults.check()
            return self.engine.step(self._publish_reserved, self._decided)
        except RequestFault as fault:
            log.warning("%s; the request is aborted", fault)
            aborted = self.engine.abort(fault.request_id)
            self._announce(self._fault_listeners, fault)
            return StepResult((), (), (), (), 0, 0.0, (), {hold.request_id: hold for hold in aborted.holds})

    def _drain_commands(self) -> None:
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                with self.engine.lock:
                    future.set_result(fn(self.engine))
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

    def _end(self, reason: str) -> None:
        self._ended = reason
        self._fail_pending()

    def _fail_pending(self) -> None:
        assert self._ended is not None
        while True:
            try:
                _, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(EngineFailed(self._ended))

    def _decided(self) -> None:
        """The stats as the step's scheduling decision left them, for the step's forward pass."""
        self._stats = self.engine.scheduler.stats()

    def _publish_reserved(self, reserved: tuple[Reservation, ...]) -> None:
        """Reservations go out before the step's forward pass: the prefill worker can start."""
        self._publish(StepResult((), (), (), (), 0, 0.0, reserved))

    def _publish(self, result: StepResult) -> None:
        assert self._loop is not None
        for listener in self._listeners:
            self._loop.call_soon_threadsafe(listener, result)

    def _announce(self, listeners: list, arg: BaseException) -> None:
        """Run each listener(arg) on the event loop (skipped once the loop is closed)."""
        assert self._loop is not None
        try:
            for listener in listeners:
                self._loop.call_soon_threadsafe(listener, arg)
        except RuntimeError:
            log.warning("event loop closed; %d listeners not told of %r", len(listeners), arg)
