"""A queue of requests kept in (rank, arrival) order, as lanes sorted by arrival."""

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
    waiting requests are admitted."""

    RUNNING = 0
    SWAPPED = 1
    WAITING = 2


class Candidate(NamedTuple):
    rank: int
    group: Group
    seq: int  # arrival_seq
    request: Request


class _Item(NamedTuple):
    seq: int
    entered: float
    request: Request


def _seq(item: _Item) -> int:
    return item.seq


class RequestQueue:
    def __init__(self, order: QueueOrder, group: Group):
        self._order = order
        self._group = group
        self._lanes: dict[int, list[_Item]] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Request]:
        return (item.request for lane in self._lanes.values() for item in lane)

    def push(self, request: Request, entered: float) -> None:
        lane = self._lanes.setdefault(self._order.lane(request), [])
        bisect.insort(lane, _Item(request.arrival_seq, entered, request), key=_seq)
        self._len += 1

    def remove(self, request: Request) -> None:
        lane = self._lanes[self._order.lane(request)]
        i = bisect.bisect_left(lane, request.arrival_seq, key=_seq)
        assert i < len(lane) and lane[i].request is request, f"{request.request_id} is not queued here"
        del lane[i]
        self._len -= 1

    def candidates(self, now: float) -> Iterator[Candidate]:
        """Every queued request in (rank, arrival) order. Iterates a snapshot: removing
        requests while consuming it is safe."""
        return heapq.merge(*(self._lane(tuple(lane), now) for lane in self._lanes.values() if lane))

    def _lane(self, items: tuple[_Item, ...], now: float) -> Iterator[Candidate]:
        rank, group = self._order.rank, self._group
        for item in items:
            yield Candidate(rank(item.request, now - item.entered), group, item.seq, item.request)
