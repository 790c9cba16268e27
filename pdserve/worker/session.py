"""One request's event stream on a worker: the engine side pushes, the servicer iterates
(the requests and their ids: pdserve/worker/live.py)."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator

from pdserve.aborts import Owner
from pdserve.coalescing import NOTHING, joined_tokens, merged_with_waiting
from pdserve.worker.events import Departed, Event, Failed, Finished, FirstToken, Tokens


class Ending(enum.Enum):
    """How a session's stream ended, as far as its consumer saw."""

    OPEN = "open"  # still streaming, or cut off from outside (cancel, client deadline)
    FINISHED = "finished"  # the engine ended the request itself: Finished, FirstToken or Departed was delivered
    FAILED = "failed"  # a Failed event ended it (transfer, KV deadline, abort, engine failure)


class Session:
    def __init__(self, request_id: str, owner: Owner | None = None):
        """`owner`: the client's request it serves (an Abort of it through any router ends it)."""
        self.request_id = request_id
        self.owner = owner
        self.created = time.monotonic()
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self.ending = Ending.OPEN

    @property
    def finished_by_engine(self) -> bool:
        """True only when the engine ended the request: then nothing of it is left to abort."""
        return self.ending is Ending.FINISHED

    def push(self, event: Event) -> None:
        if self.ending is Ending.OPEN:
            self._events.put_nowait(event)

    def fail(self, error: BaseException) -> None:
        self.push(Failed(error))

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
            if isinstance(event, (Finished, FirstToken, Departed)):
                self.ending = Ending.FINISHED
            yield event
            if self.ending is Ending.FINISHED:
                return


