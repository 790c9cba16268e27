"""The OpenAI door's server-sent events (aiohttp_sse's response, its `send` made for what this door
sends): a message per output, each relayed token's cost, so per message no more than a frame and a
write.

    send(data, id)   what this door sends (a JSON document or [DONE], one line; ids of its own) as
                     one frame formatted at once and written; anything else (an event name, a retry,
                     a line break) as the library formats it
    a stalled client a write still waiting `send_timeout` after it began aborts the connection (the
                     write fails, the request is cancelled), as the library's timer around each
                     write does; here one watch per stream looks every quarter of it, not a timer
                     armed and cancelled per message
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp_sse import EventSourceResponse

WATCHES_PER_TIMEOUT = 4  # how often the watch looks, per send_timeout


class EventStream(EventSourceResponse):
    def __init__(self, *, send_timeout: float | None = EventSourceResponse.DEFAULT_SEND_TIMEOUT, **kwargs):
        super().__init__(send_timeout=send_timeout, **kwargs)
        self._stall_s = send_timeout
        self._writing_since: float | None = None  # loop time the pending write began (None: none pending)
        self._request: web.BaseRequest | None = None
        self._watch: asyncio.Task | None = None

    async def prepare(self, request: web.BaseRequest):
        writer = await super().prepare(request)
        if self._watch is None and self._stall_s is not None:
            self._request = request
            self._watch = asyncio.ensure_future(self._watch_writes(self._stall_s))
        return writer

    async def send(self, data: str, id: str | None = None, event: str | None = None,
                   retry: int | None = None) -> None:
        if event is not None or retry is not None or not _one_line(data) or (id is not None and not _an_id(id)):
            await super().send(data, id=id, event=event, retry=retry)
            return
        frame = f"data: {data}\r\n\r\n" if id is None else f"id: {id}\r\ndata: {data}\r\n\r\n"
        self._writing_since = asyncio.get_running_loop().time()
        try:
            await self.write(frame.encode())
        except ConnectionResetError:
            self.stop_streaming()
            raise
        finally:
            self._writing_since = None

    def stop_streaming(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        super().stop_streaming()

    async def _watch_writes(self, stall_s: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(stall_s / WATCHES_PER_TIMEOUT)
            since = self._writing_since
            if since is not None and loop.time() - since >= stall_s:
                transport = self._request.transport if self._request is not None else None
                if transport is not None:
                    transport.abort()  # a stalled peer never drains: no graceful close
                return


def _one_line(text: str) -> bool:
    return "\n" not in text and "\r" not in text


def _an_id(text: str) -> bool:
    return _one_line(text) and "\0" not in text
