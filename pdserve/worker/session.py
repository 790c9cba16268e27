"""One request's event stream on a worker: the engine side pushes, the servicer iterates
(the requests and their ids: pdserve/worker/live.py). On a router's event feed
(pdserve/worker/feed.py) the events go by the feed instead, and the servicer awaits the end."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from pdserve.aborts import Owner
from pdserve.coalescing import NOTHING, joined_tokens, merged_with_waiting
from pdserve.rpc.errors import Unavailable
from pdserve.worker.events import Departed, Event, Failed, Finished, FirstToken, Tokens
from pdserve.worker.feed import Feed

TERMINAL = (Finished, FirstToken, Departed)
Observer = Callable[[Event], None]


class Ending(enum.Enum):
    """How a session's stream ended, as far as its consumer saw."""

    OPEN = "open"  # still streaming, or cut off from outside (cancel, client deadline)
    FINISHED = "finished"  # the engine ended the request itself: Finished, FirstToken or Departed was delivered
    FAILED = "failed"  # a Failed event ended it (transfer, KV deadline, abort, engine failure)
    ORPHANED = "orphaned"  # its call broke without an Abort: nobody reads it (decode_service/orphans.py)


@dataclass(frozen=True)
class FedEnd:
    """How a request on a feed ended: `events` sent by the feed before it, then `error` (None: the
    engine ended it, its last event on the feed says how)."""

    events: int
    error: BaseException | None


class Session:
    def __init__(self, request_id: str, owner: Owner | None = None, feed: Feed | None = None,
                 observe: Observer | None = None):
        """`owner`: the client's request it serves (an Abort of it through any router ends it).
        `feed`: its events go there (None: by `events()`). `observe`: sees each event delivered."""
        self.request_id = request_id
        self.owner = owner
        self.created = time.monotonic()
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self.ending = Ending.OPEN
        self.tokens = 0  # delivered
        self._observe = observe
        self._feed = feed
        self._fed = 0
        self._end: asyncio.Future[BaseException | None] | None = None
        if feed is not None:
            self._end = asyncio.get_running_loop().create_future()
            feed.attach(self, Unavailable(f"the event feed of request {request_id} is closed"))

    @property
    def finished_by_engine(self) -> bool:
        """True only when the engine ended the request: then nothing of it is left to abort."""
        return self.ending is Ending.FINISHED

    def push(self, event: Event) -> None:
        if self.ending is not Ending.OPEN:
            return
        if self._feed is None:
            self._events.put_nowait(event)
        elif isinstance(event, Failed):
            self._ended(Ending.FAILED, event.error)
        else:
            self._delivered(event)
            self._fed += self._feed.put(self.request_id, event)
            if isinstance(event, TERMINAL):
                self._ended(Ending.FINISHED, None)

    def fail(self, error: BaseException) -> None:
        self.push(Failed(error))

    def detach(self) -> None:
        """The request ended here: nothing more of it goes by its feed."""
        if self._feed is not None:
            self._feed.detach(self)

    def orphan(self) -> None:
        """Its call broke, its request lives on: nothing more is delivered by this session."""
        self.detach()
        self._ended(Ending.ORPHANED, None)

    async def fed_end(self) -> FedEnd:
        """(On a feed) once the request ended: how many events went by the feed, and its error."""
        assert self._end is not None, "a session without a feed streams by events()"
        error = await asyncio.shield(self._end)
        return FedEnd(self._fed, error)

    async def events(self) -> AsyncIterator[Event]:
        """Yields until a terminal event; a Failed event raises its error instead. Tokens waiting
        when the reader comes back for more are merged into one event (pdserve/coalescing.py)."""
        held: object = NOTHING
        while True:
            event = await self._events.get() if held is NOTHING else held
            if isinstance(event, Tokens):
                event, held = merged_with_waiting(event, self._events, joined_tokens)
            else:
                held = NOTHING
            if isinstance(event, Failed):
                self.ending = Ending.FAILED
                raise event.error
            if isinstance(event, TERMINAL):
                self.ending = Ending.FINISHED
            self._delivered(event)
            yield event
            if self.ending is Ending.FINISHED:
                return

    def _delivered(self, event: Event) -> None:
        if isinstance(event, Tokens):
            self.tokens += len(event.token_ids)
        if self._observe is not None:
            self._observe(event)

    def _ended(self, ending: Ending, error: BaseException | None) -> None:
        self.ending = ending
        if self._end is not None and not self._end.done():
            self._end.set_result(error)
