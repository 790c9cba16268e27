"""A streamed OpenAI completion read as a browser's EventSource would: server-sent events with their
ids, and, when the connection breaks (its router died, or stalled past the read timeout), the
same POST again at the next router with the last id as `Last-Event-ID` (router/doors/http/app.py)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

READ_TIMEOUT_S = 6.0  # a router silent this long is taken for gone (its stream goes on elsewhere)


@dataclass
class Streamed:
    text: str = ""
    ids: list[str] = field(default_factory=list)  # every event's, in order
    finish: str | None = None
    usage: dict | None = None
    posts: list[int] = field(default_factory=list)  # the port of each POST, in order
    statuses: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """The tokens the client has, by the last event's id."""
        return int(self.ids[-1].rpartition("/")[2]) if self.ids else 0


class StreamFailed(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


def stream_completion(ports: Sequence[int], body: dict, request_id: str, token: str | None = None,
                      failovers: int = 4, on_event: Callable[[Streamed], None] = lambda seen: None) -> Streamed:
    """POST /v1/completions (stream) to ports[0], then the next port after each broken connection;
    `on_event(seen)` after each event."""
    seen = Streamed()
    for attempt in range(failovers + 1):
        port = ports[attempt % len(ports)]
        seen.posts.append(port)
        try:
            for event_id, data in _events(port, body, request_id, seen.ids[-1] if seen.ids else None, token, seen):
                seen.ids.append(event_id)
                if data == "[DONE]":
                    return seen
                _take(seen, json.loads(data))
                on_event(seen)
        except (OSError, http.client.HTTPException):
            continue
    raise StreamFailed(0, f"no router finished the stream after {failovers} failovers: {seen}")


def _events(port: int, body: dict, request_id: str, last_id: str | None, token: str | None,
            seen: Streamed) -> Iterator[tuple[str, str]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=READ_TIMEOUT_S)
    try:
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        connection.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), headers)
        reply = connection.getresponse()
        seen.statuses.append(reply.status)
        if reply.status != 200:
            raise StreamFailed(reply.status, reply.read().decode())
        event_id, data = None, []
        while line := reply.fp.readline():
            line = line.decode().rstrip("\r\n")
            if line.startswith("id:"):
                event_id = line[3:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif not line and data:
                yield event_id, "\n".join(data)
                event_id, data = None, []
        raise ConnectionError("the stream ended before [DONE]")
    finally:
        connection.close()


def _take(seen: Streamed, chunk: dict) -> None:
    if "error" in chunk:
        raise StreamFailed(200, json.dumps(chunk))
    for choice in chunk.get("choices") or ():
        seen.text += choice.get("text") or ""
        seen.finish = choice.get("finish_reason") or seen.finish
    if chunk.get("usage"):
        seen.usage = chunk["usage"]
