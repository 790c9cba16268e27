"""Time slices within a class: when a started stream that waits may take the place of a running
request of its own class.

victims.py never lets a request preempt one of its own class. In overload that makes a stream in
progress (resumed here after a fault, or preempted here) wait until another of its class ends:
a resumed VIP on a survivor whose pool cannot hold every live VIP waited many seconds, its
client mid-stream. A slice policy shares such a wait out in bounded slices:

    claimant  the best queued request (queue order); its stream started (a token out already);
              waited >= quantum, as the queue counts waiting (a hand-over: its age; a victim:
              from when it was taken off)
    victim    running, of the claimant's class, admitted at a rank no better than the claimant's
              now; ran >= quantum since its last admission and sampled >= min_tokens since then
              (so a recomputed victim streams before it can be taken off again); the one
              admitted longest ago first

A victim leaves like any preempted request (swap or recompute, Preemptor.slice_out) and queues
behind the streams of its class already waiting: it goes back in after them, and after a quantum
of waiting it claims a slice in turn. New requests (no token out) never claim one.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Iterable

from pdserve.requests import Request
from pdserve.scheduler.queue import Candidate, Group
from pdserve.scheduler.state import Admission


class SlicePolicy(abc.ABC):
    @abc.abstractmethod
    def claims(self, head: Candidate, now: float) -> bool:
        """May the best prefill, `head`, take a running request's place among its own class now?"""

    @abc.abstractmethod
    def pick(self, head: Candidate, running: Iterable[Request], protected: Collection[str],
             admitted: Callable[[Request], Admission], now: float) -> Request | None:
        """A victim for a `head` that claims a slice, never one whose id is in `protected`
        (scheduled earlier in this step). None: nobody."""


class NoSlices(SlicePolicy):
    """No request preempts one of its own class: a started stream waits for room."""

    def claims(self, head: Candidate, now: float) -> bool:
        return False

    def pick(self, head: Candidate, running: Iterable[Request], protected: Collection[str],
             admitted: Callable[[Request], Admission], now: float) -> Request | None:
        return None


class StartedStreamSlices(SlicePolicy):
    """A started stream that waited a quantum takes the place of the request of its class that has
    run longest since its admission, once that one ran a quantum (and `min_tokens` tokens)."""

    def __init__(self, quantum_s: float, min_tokens: int):
        self.quantum_s = quantum_s
        self.min_tokens = min_tokens

    def claims(self, head: Candidate, now: float) -> bool:
        return head.group != Group.RUNNING and bool(head.request.output_token_ids) \
            and now - head.entered >= self.quantum_s

    def pick(self, head: Candidate, running: Iterable[Request], protected: Collection[str],
             admitted: Callable[[Request], Admission], now: float) -> Request | None:
        best, best_key = None, (now - self.quantum_s, float("inf"))
        for request in running:
            if request.priority != head.request.priority or request.request_id in protected:
                continue
            admission = admitted(request)
            key = (admission.at, request.admit_seq)
            if key < best_key and admission.rank >= head.rank \
                    and len(request.output_token_ids) - admission.outputs >= self.min_tokens:
                best, best_key = request, key
        return best
