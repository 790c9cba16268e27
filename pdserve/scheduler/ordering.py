"""Queue order policies: which class a request is served in, and how waiting lifts it.

A request's rank is its effective class (lower is served first); within a rank, earlier
arrival first (`arrival_seq`, which survives preemption, so a victim keeps its place).
NOTE: along one lane sorted by arrival, rank never decreases (older requests waited longer),
so the lanes merge into one ordered stream without sorting. And a request's rank never rises
as it waits longer, nor above its lane: the preemptor relies on it to remember that no running
request ranks below a class (see Preemptor.pick).
"""

from __future__ import annotations

import abc

from pdserve.requests import Priority, Request


class QueueOrder(abc.ABC):
    @abc.abstractmethod
    def lane(self, request: Request) -> int:
        """Fixed for a request's life: requests of one lane are kept in arrival order."""

    @abc.abstractmethod
    def rank(self, request: Request, waited_s: float) -> int:
        """Effective class after waiting waited_s seconds since it was added."""


class PriorityOrder(QueueOrder):
    """Priority classes; with aging, each `aging_seconds` of waiting lifts a request one class
    (BATCH -> NORMAL -> VIP rank), so a low class cannot starve."""

    def __init__(self, aging_seconds: float | None):
        self._aging_s = aging_seconds

    def lane(self, request: Request) -> int:
        return int(request.priority)

    def rank(self, request: Request, waited_s: float) -> int:
        if self._aging_s is None:
            return int(request.priority)
        return max(int(Priority.VIP), int(request.priority) - int(waited_s // self._aging_s))


class ArrivalOrder(QueueOrder):
    """One class for everyone: plain arrival order."""

    def lane(self, request: Request) -> int:
        return 0

    def rank(self, request: Request, waited_s: float) -> int:
        return 0
