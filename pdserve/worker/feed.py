"""A router's event feed on a worker: the events of every request that router opened with it, one
message per engine step instead of one per request (the requests' sessions: pdserve/worker/session.py).

    engine step ──on_step──▶ session.push ──▶ Feed.put(request id, event)     pending, per request in order
                                               (a request's token events waiting together joined)
    the Events stream ◀── batches() ◀── all that is pending, once the loop is free (the step's events
                                         together; while the router reads slowly, the steps meanwhile)

What waits is bounded as a request's own stream bounds it: one event per kind change per request,
its tokens joined. Closing a feed (its router's stream ended) fails the sessions still on it.

A worker that starts to drain says so on every feed once (`Feeds.leave`, a feed opened after
included): its routers move their requests at once instead of at their next Stats poll.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Protocol

from pdserve.coalescing import joined_tokens
from pdserve.worker.events import Event, Tokens

Batch = dict[str, list[Event]]  # request id -> its events, in order


class FedSession(Protocol):
    """What a feed asks of a session on it (pdserve/worker/session.py)."""

    request_id: str

    def fail(self, error: BaseException) -> None: ...


class Feed:
    def __init__(self, feed_id: str, leaving: bool = False):
        self.id = feed_id
        self.closed = False
        self._leaving = leaving  # to be said on the next message
        self._pending: Batch = {}
        self._wake = asyncio.Event()
        if leaving:
            self._wake.set()
        self._sessions: dict[str, FedSession] = {}

    def attach(self, session: FedSession, closed_error: BaseException) -> None:
        """`session` sends by this feed until it ends (`detach`); on a closed feed it fails at once."""
        if self.closed:
            session.fail(closed_error)
        else:
            self._sessions[session.request_id] = session

    def detach(self, session: FedSession) -> None:
        if self._sessions.get(session.request_id) is session:
            del self._sessions[session.request_id]

    def put(self, request_id: str, event: Event) -> bool:
        """Queue `event` for the next message: True when it is a new event on the wire, False when
        it joined the request's token event waiting there (or the feed is closed: dropped)."""
        if self.closed:
            return False
        events = self._pending.get(request_id)
        if events is None:
            self._pending[request_id] = [event]
            self._wake.set()
            return True
        if isinstance(event, Tokens) and isinstance(events[-1], Tokens):
            joined = joined_tokens(events[-1], event)
            if joined is not None:
                events[-1] = joined
                return False
        events.append(event)
        return True

    def leave(self) -> None:
        """Its worker leaves: the feed says so before its next batch (`take_leaving`)."""
        self._leaving = True
        self._wake.set()

    def take_leaving(self) -> bool:
        """Whether to say now that the worker leaves (True once)."""
        leaving, self._leaving = self._leaving, False
        return leaving

    async def batches(self) -> AsyncIterator[Batch]:
        """Everything pending, each time there is some, until the feed closes."""
        while True:
            await self._wake.wait()
            if self.closed:
                return
            self._wake.clear()
            batch, self._pending = self._pending, {}
            yield batch

    def close(self, error: BaseException) -> None:
        """No more messages; every session still on it fails with `error`."""
        self.closed = True
        self._pending = {}
        self._wake.set()
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            session.fail(error)


class Feeds:
    """The feeds open on a worker, by id (ids are drawn at random: only the router that opened a
    feed knows its id)."""

    def __init__(self) -> None:
        self._feeds: dict[str, Feed] = {}
        self.leaving = False

    def open(self) -> Feed:
        feed = Feed(secrets.token_hex(8), self.leaving)
        self._feeds[feed.id] = feed
        return feed

    def get(self, feed_id: str) -> Feed | None:
        return self._feeds.get(feed_id)

    def close(self, feed: Feed, error: BaseException) -> None:
        self._feeds.pop(feed.id, None)
        feed.close(error)

    def leave(self) -> None:
        """The worker leaves (it drains): every feed says so once, one opened later at once."""
        self.leaving = True
        for feed in self._feeds.values():
            feed.leave()

    def close_all(self, error: BaseException) -> None:
        for feed in list(self._feeds.values()):
            self.close(feed, error)

    def __len__(self) -> int:
        return len(self._feeds)
