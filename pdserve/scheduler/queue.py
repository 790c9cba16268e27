"""A queue of requests kept in (rank, group, entered) order, as lanes sorted by when they entered.

A request enters when it is added, or earlier by its `age_s`: a hand-over from another worker
(a resume after a fault) keeps the place its age gives it, ahead of requests that came later.
A preempted request enters again as old as the wait it had when it was admitted (aging counts
waiting, not running). Each (class lane, group) is one sorted lane; the lanes merge.
"""

from __future__ import annotations

import bisect
import enum
import heapq
from collections.abc import Iterator
from typing import NamedTuple

from pdserve.requests import Request
from pdserve.scheduler.ordering import QueueOrder


class Group(enum.IntEnum):
    """Within one rank: running prefills continue first, then swapped requests resume, then
    streams without KV here resume (recompute victims, hand-overs of streams begun elsewhere),
    then new requests are admitted. A stream in progress goes before one not yet begun. A time
    slice's victim (slicing.py) queues as RESUMING, swapped or not: after those already waiting."""

    RUNNING = 0
    SWAPPED = 1
    RESUMING = 2
    WAITING = 3


class Candidate(NamedTuple):
    rank: int
    group: Group
    entered: float  # now - entered is how long it has waited, as aging counts it
    seq: int  # arrival_seq: ties of `entered` in arrival order
    request: Request


class _Item(NamedTuple):
    entered: float
    seq: int
    request: Request


def _place(item: _Item) -> tuple[float, int]:
    return item.entered, item.seq


class RequestQueue:
    def __init__(self, order: QueueOrder, group: Group):
        """`group`: what a push without one is (the queue's usual kind of request)."""
        self._order = order
        self._group = group
        self._lanes: dict[tuple[int, Group], list[_Item]] = {}
        self._where: dict[str, tuple[tuple[int, Group], _Item]] = {}  # request id -> (lane key, item)

    def __len__(self) -> int:
        return len(self._where)

    def __iter__(self) -> Iterator[Request]:
        return (item.request for lane in self._lanes.values() for item in lane)

    def push(self, request: Request, entered: float, group: Group | None = None) -> None:
        key = (self._order.lane(request), self._group if group is None else group)
        item = _Item(entered, request.arrival_seq, request)
        self._where[request.request_id] = key, item
        bisect.insort(self._lanes.setdefault(key, []), item, key=_place)

    def remove(self, request: Request) -> None:
        key, item = self._where.pop(request.request_id)
        lane = self._lanes[key]
        i = bisect.bisect_left(lane, _place(item), key=_place)
        assert i < len(lane) and lane[i].request is request, f"{request.request_id} is not queued here"
        del lane[i]

    def candidates(self, now: float) -> Iterator[Candidate]:
        """Every queued request in (rank, group, entered) order. Iterates a snapshot: removing
        requests while consuming it is safe."""
        return heapq.merge(*(self._lane(key[1], tuple(lane), now) for key, lane in self._lanes.items() if lane))

    def _lane(self, group: Group, items: tuple[_Item, ...], now: float) -> Iterator[Candidate]:
        rank = self._order.rank
        for item in items:
            yield Candidate(rank(item.request, now - item.entered), group, item.entered, item.seq, item.request)
