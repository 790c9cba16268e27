"""Queue order policies: which class a request is served in, and how waiting lifts it.

A request's rank is its effective class (lower is served first); within a rank, the one that
entered first (see queue.py: its arrival, back-dated by the age a hand-over brings; a preempted
request enters again as old as the wait it had when admitted, and resumes before new requests).
NOTE: along one lane sorted by entry, rank never decreases (earlier entries waited longer), so
the lanes merge into one ordered stream without sorting. A request's rank never rises as it
waits longer, nor above its lane.

Aging lifts a request while it waits, not while it runs: a running request's rank, the one
victim choice reads, is the rank it had when it was admitted (Queues.running_rank). A chat that
has run for a minute is not starving, and a VIP that arrives (or a resumed VIP stream) may
preempt it; a BATCH request lifted while it waited keeps that lift while it runs.
"""

from __future__ import annotations

import abc

from pdserve.requests import Priority, Request


class QueueOrder(abc.ABC):
    @abc.abstractmethod
    def lane(self, request: Request) -> int:
        """Fixed for a request's life: requests of one lane are kept in the order they entered."""

    @abc.abstractmethod
    def rank(self, request: Request, waited_s: float) -> int:
        """Effective class after waiting waited_s seconds since it was added."""


class PriorityOrder(QueueOrder):
    """Priority classes; with aging, each `aging_seconds` of waiting lifts a request one class,
    up to NORMAL rank (BATCH -> NORMAL), so BATCH cannot starve behind NORMAL arrivals. VIP rank
    is for VIPs alone: every VIP goes before every other request, and may preempt any of them
    (victims.py), so no request lifted level with a VIP is preempted for it and taken again."""

    def __init__(self, aging_seconds: float | None):
        self._aging_s = aging_seconds

    def lane(self, request: Request) -> int:
        return int(request.priority)

    def rank(self, request: Request, waited_s: float) -> int:
        if self._aging_s is None:
            return int(request.priority)
        highest = min(int(request.priority), int(Priority.NORMAL))  # aging never reaches VIP rank
        return max(highest, int(request.priority) - int(waited_s // self._aging_s))


class ArrivalOrder(QueueOrder):
    """One class for everyone: plain arrival order."""

    def lane(self, request: Request) -> int:
        return 0

    def rank(self, request: Request, waited_s: float) -> int:
        return 0
