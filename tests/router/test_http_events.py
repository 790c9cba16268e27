"""The OpenAI door's server-sent events (router/doors/http/events.py): what a client reads is what
aiohttp_sse's own response sends, byte for byte, whatever the message; a client that stops reading
has its connection aborted once a write waited the send timeout, as the library's does."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp_sse import EventSourceResponse, sse_response

from router.doors.http.events import EventStream

pytestmark = pytest.mark.timeout(60)

MESSAGES = [('{"a": 1}', "7"), ("[DONE]", None), ("two\nlines", "8"), ('{"text": "é \\n"}', "9-1")]


async def _body(response_cls: type[EventSourceResponse]) -> bytes:
    async def handler(request: web.Request) -> web.StreamResponse:
        async with sse_response(request, response_cls=response_cls, ping_interval=3600) as events:
            for data, event_id in MESSAGES:
                await events.send(data, id=event_id)
            await events.send("named", event="note")
        return events

    app = web.Application()
    app.router.add_get("/", handler)
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/")
        return await response.read()


def test_what_a_client_reads_is_what_the_library_sends():
    ours, theirs = asyncio.run(_body(EventStream)), asyncio.run(_body(EventSourceResponse))
    assert ours == theirs and b"data: [DONE]" in ours


def test_a_client_that_stops_reading_has_its_connection_aborted(monkeypatch):
    # the kernel's TCP_USER_TIMEOUT, which the library also sets, left out: the watch alone ends it
    monkeypatch.setattr(EventSourceResponse, "_set_tcp_user_timeout", lambda self, request: None)

    async def main():
        ended: asyncio.Future = asyncio.get_running_loop().create_future()

        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                async with sse_response(request, response_cls=EventStream, send_timeout=0.4,
                                        ping_interval=3600) as events:
                    while True:  # until the kernel's buffers are full and a write waits
                        await events.send("x" * 65536, id="1")
            except BaseException as exc:
                ended.set_result(exc)
                raise

        app = web.Application()
        app.router.add_get("/", handler)
        server = TestServer(app)
        await server.start_server()
        sock = socket.create_connection((server.host, server.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
            exc = await asyncio.wait_for(ended, 30)
            assert isinstance(exc, (ConnectionResetError, asyncio.CancelledError))
        finally:
            sock.close()
            await server.close()

    asyncio.run(main())
