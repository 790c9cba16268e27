"""One request's event stream on a worker: the engine side pushes, the servicer iterates."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from pdserve.worker.events import Event, Failed, Finished, PrefillDone


class Session:
    def __init__(self, request_id: str):
        self.request_id = request_id
        self.created = time.monotonic()
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self.closed = False

    def push(self, event: Event) -> None:
        if not self.closed:
            self._events.put_nowait(event)

    def fail(self, error: Exception) -> None:
        self.push(Failed(error))

    async def events(self) -> AsyncIterator[Event]:
        """Yields until a terminal event; a Failed event raises its error instead."""
        while True:
            event = await self._events.get()
            if isinstance(event, Failed):
                self.closed = True
                raise event.error
            yield event
            if isinstance(event, (Finished, PrefillDone)):
                self.closed = True
                return


class SessionTable:
    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}

    def open(self, request_id: str) -> Session:
        session = Session(request_id)
        self._sessions[request_id] = session
        return session

    def get(self, request_id: str) -> Session | None:
        return self._sessions.get(request_id)

    def close(self, request_id: str) -> Session | None:
        return self._sessions.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._sessions
