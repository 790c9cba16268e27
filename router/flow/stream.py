"""A worker call read in the background, so that its failure is seen even while nobody reads it
(a PushCall, whose events its feed hands over as they come, needs no reader: this is its sink).

A decode call's token events may be gathered (`gather(n)`, the stream interval's N once the
request's first token is out): they wake the reader only once n tokens wait, as one `Gathered`
with each step's arrival (the trace's timeline stays per step); anything else lets them go first.

Token events (and gathered runs) may also be taken directly (`take_directly`): while the reader
waits with nothing queued before them, the taker handles them as they come (the feed's reader
calls it), so the request's task does not wake for them; anything queued goes first, so the
reader still sees every other event in order after the tokens that preceded it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import NamedTuple, TypeVar

from pdserve.coalescing import joined_run
from pdserve.worker.events import Tokens
from router.fleet.clients import Call, PushCall, WorkerFault

T = TypeVar("T")
Taker = Callable[[object], bool]  # takes a token event or a Gathered as it comes (True), or leaves it queued
_END = object()
_CHECK = object()  # next_within's period passed
_NOTICE = object()  # its worker said it leaves: a check now, the period's timer left as it is


class Gathered(NamedTuple):
    """Token events that waited together, joined; `arrived`: (time.perf_counter(), tokens) per event."""

    tokens: Tokens
    arrived: tuple[tuple[float, int], ...]


class Pumped:
    """Events of `call` in arrival order; a fault comes after the events that preceded it.
    NOTE: one reader at a time (the request's flow)."""

    def __init__(self, call: Call | PushCall, address: str):
        self.call = call
        self.address = address
        self.failed = asyncio.Event()
        self.fault: WorkerFault | None = None  # set when the call failed
        self.leaving = False  # its worker said it leaves (a feed's notice: before any poll says so)
        self._items: deque = deque()
        self._waiter: asyncio.Future | None = None  # its reader's, while it waits
        self._task: asyncio.Future | None = None
        self._check: asyncio.TimerHandle | None = None  # next_within's period, while one runs
        self._gather = 0  # tokens that wake the reader (0: every event does)
        self._run: list[Tokens | tuple[int, ...]] = []  # token events gathered (or their ids alone), not let go yet
        self._run_plain = True  # every one of them ids alone
        self._arrived: list[tuple[float, int]] = []
        self._run_tokens = 0
        self._taker: Taker | None = None
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
        if self._gather and type(event) is Tokens and not event.prompt_logprobs:
            self._run_plain = False
            self._gathering(event, len(event.token_ids))
            return
        if self._run:
            self._let_go()
        if type(event) is Tokens:
            self._offer(event)
        else:
            self._put(event)

    def deliver_tokens(self, token_ids: tuple[int, ...]) -> None:
        if self._gather:  # gathered as they are: one Tokens for the run when it goes
            self._gathering(token_ids, len(token_ids))
            return
        if self._run:
            self._let_go()
        self._offer(Tokens(token_ids))

    def end(self) -> None:
        if self._run:
            self._let_go()
        self._put(_END)

    def fail(self, fault: WorkerFault) -> None:
        if self._run:
            self._let_go()
        self.fault = fault
        self._put(fault)
        self.failed.set()

    def worker_leaving(self) -> None:
        """Its worker said it leaves: the reader's periodic check comes now (`next_within`)."""
        self.leaving = True
        self._put(_NOTICE)

    # ---- gathering ----

    def gather(self, tokens: int) -> None:
        """Token events wake the reader only once `tokens` wait (0: each as it comes). NOTE: the
        reader asks for it only where nothing would be sent sooner."""
        self._gather = tokens

    def gathered(self) -> Gathered | None:
        """The token events gathered and not let go yet, taken (the reader's last look, when cancelled)."""
        if not self._run:
            return None
        run = self._run
        if self._run_plain:  # ids alone (deliver_tokens): one object for the whole run
            tokens = Tokens(run[0] if len(run) == 1 else tuple(t for ids in run for t in ids))
        else:
            tokens = joined_run([Tokens(e) if type(e) is tuple else e for e in run])
        gathered = Gathered(tokens, tuple(self._arrived))
        self._run, self._arrived, self._run_tokens, self._run_plain = [], [], 0, True
        return gathered

    def _gathering(self, event: Tokens | tuple[int, ...], count: int) -> None:
        self._run.append(event)
        self._arrived.append((time.perf_counter(), count))
        self._run_tokens += count
        if self._run_tokens >= self._gather:
            self._let_go()

    def _let_go(self) -> None:
        if (gathered := self.gathered()) is not None:
            self._offer(gathered)

    # ---- taken directly ----

    def take_directly(self, taker: Taker | None) -> None:
        """Token events (and gathered runs) go to `taker` as they come while the reader waits with
        nothing queued (None: all are queued again). NOTE: the taker runs in the deliverer's
        context (the feed's reader): quick, and what it leaves, it leaves untouched."""
        self._taker = taker

    def _offer(self, tokens: object) -> None:
        waiting = self._waiter is not None and not self._waiter.done()
        if self._taker is None or self._items or not waiting or not self._taker(tokens):
            self._put(tokens)

    async def next(self) -> object:
        while (item := await self._get()) is _CHECK or item is _NOTICE:
            if item is _CHECK:
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
        if item is _NOTICE:
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
