"""Victim choice: whom to preempt when blocks run out or a higher class waits."""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Iterable

from pdserve.requests import Priority, Request


class VictimPolicy(abc.ABC):
    @abc.abstractmethod
    def pick(self, running: Iterable[Request], protected: Collection[str], rank: Callable[[Request], int],
             worse_than: int | None = None) -> Request | None:
        """A victim among `running`, never one whose id is in `protected` (scheduled earlier in
        this step) and never a VIP; only ranks > worse_than when given. None: nobody."""


class LowestClassLatest(VictimPolicy):
    """Lowest effective class first, then the most recently admitted."""

    def pick(self, running: Iterable[Request], protected: Collection[str], rank: Callable[[Request], int],
             worse_than: int | None = None) -> Request | None:
        floor = -1 if worse_than is None else worse_than
        best, best_key = None, (floor, -1)
        for request in running:
            if request.priority == Priority.VIP or request.request_id in protected:
                continue
            key = (rank(request), request.admit_seq)
            if key[0] > floor and key > best_key:
                best, best_key = request, key
        return best
