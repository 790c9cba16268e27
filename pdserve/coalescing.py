"""Token events merged while their reader is behind: what waits in a stream's queue when its
reader comes back for more goes out as one message, not one per token. A reader that keeps up
sees every event as it came (nothing waits, nothing is merged), so this costs no latency; one that
falls behind (a slow client, a router at its CPU limit) catches up in fewer, larger messages
instead of a growing queue. Used on both hops: a decode worker's stream to the router
(pdserve/worker/session.py) and the router's to its client (router/doors/gateway.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def merged_with_waiting(first: T, queue: asyncio.Queue, merge: Callable[[T, object], T | None]) -> tuple[T, object]:
    """`first` merged with the items already waiting in `queue` that `merge(so_far, item)` takes
    (it returns None for one it does not); the first item it does not take comes back second
    (NOTHING when the queue ran dry), for the caller to handle next."""
    while not queue.empty():
        item = queue.get_nowait()
        joined = merge(first, item)
        if joined is None:
            return first, item
        first = joined
    return first, NOTHING


def joined_tokens(first: T, item: object) -> T | None:
    """Two token events of one kind (fields token_ids, logprobs, prompt_logprobs) as one; None for
    an item of another kind, or one with prompt log-probabilities (only a first token has them)."""
    if type(item) is not type(first) or item.prompt_logprobs:
        return None
    return dataclasses.replace(first, token_ids=first.token_ids + item.token_ids,
                               logprobs=first.logprobs + item.logprobs)


def joined_run(events: Sequence[T]) -> T:
    """A run of token events of one kind (as joined_tokens takes them: none but the first with
    prompt log-probabilities) as one, in one pass."""
    first = events[0]
    if len(events) == 1:
        return first
    return dataclasses.replace(first, token_ids=tuple(t for e in events for t in e.token_ids),
                               logprobs=tuple(lp for e in events for lp in e.logprobs))


class _Nothing:
    def __repr__(self) -> str:
        return "NOTHING"


NOTHING = _Nothing()
