"""Victim choice: whom to preempt when blocks run out or a higher class waits.

A waiting request's claim on running ones (`Claim`): it may preempt one of a lower class whose
rank, fixed at its admission, is worse than the claimant's rank now. Aging never lifts anyone to
VIP rank (ordering.py), so a VIP may preempt anyone but a VIP (the VIP guard admits VIPs only
while that is enough to serve them, see guard.py); a request never preempts one of its own class
here (a retried request, old by the time it is placed again, does not stall the streams of its
class already running; a started stream may take a time slice of its class: slicing.py); and a
BATCH request admitted once aging lifted it is not preempted by the NORMAL ones it was lifted
level with.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Iterable
from typing import NamedTuple

from pdserve.requests import Priority, Request


class Claim(NamedTuple):
    rank: int  # the claimant's effective rank now (aging included)
    priority: Priority  # its class

    def over(self, rank: int, priority: Priority) -> bool:
        """May it preempt a running request of this rank (at admission) and class? Never a VIP."""
        return priority > self.priority and rank > self.rank

    def covers(self, other: Claim) -> bool:
        """Everyone `other` may preempt, this claim may too."""
        return self.priority <= other.priority and self.rank <= other.rank


class VictimPolicy(abc.ABC):
    @abc.abstractmethod
    def pick(self, running: Iterable[Request], protected: Collection[str], rank: Callable[[Request], int],
             claim: Claim | None = None) -> Request | None:
        """A victim among `running`, never one whose id is in `protected` (scheduled earlier in
        this step) and never a VIP; with a claim, only one it may preempt. None: nobody."""


class LowestClassLatest(VictimPolicy):
    """Lowest effective class first, then the most recently admitted."""

    def pick(self, running: Iterable[Request], protected: Collection[str], rank: Callable[[Request], int],
             claim: Claim | None = None) -> Request | None:
        best, best_key = None, (-1, -1)
        for request in running:
            if request.priority == Priority.VIP or request.request_id in protected:
                continue
            key = (rank(request), request.admit_seq)
            if key > best_key and (claim is None or claim.over(key[0], request.priority)):
                best, best_key = request, key
        return best
