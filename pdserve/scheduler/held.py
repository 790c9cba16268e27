"""Which held prompts a prefill worker gives back so that a queued request of a higher class can start.

A prefill worker whose reservations follow (`target_follows`) keeps each started prompt's KV held
until its decode worker reserves blocks for it. Those blocks are out of the scheduler's reach: a
held prompt is no running request it could preempt. While a queued request lacks blocks that
prompts of a lower class hold, it waits on their decode reservations, which may be far off when
the decode workers are full: a priority inversion. The worker asks a policy here whom to give
back; a prompt given back is computed again once its reservation comes (the prefix cache keeps
whatever of it nobody evicted meanwhile), so nothing is lost.

    queued head: priority P, lacks `short` blocks
    held prompts ──pick──> those given back (a lower class than P), or none
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import NamedTuple

from pdserve.requests import Priority


class Blocked(NamedTuple):
    """The best queued request, which cannot start whole: its class and the blocks it lacks."""

    priority: Priority
    short: int


class Held(NamedTuple):
    """A prompt whose KV waits for its reservation: its id, class, blocks held and when it was held
    (any increasing number)."""

    request_id: str
    priority: Priority
    blocks: int
    held_at: float


class HeldVictims(abc.ABC):
    @abc.abstractmethod
    def pick(self, held: Sequence[Held], blocked: Blocked) -> tuple[str, ...]:
        """The ids of the held prompts to give back for `blocked` (none: it waits)."""


class LowerClassLatest(HeldVictims):
    """Prompts of a lower class than the blocked request, the lowest class first, then the latest
    held, until their blocks cover what it lacks; none when all of them together would not (a
    give-back that cannot start it only costs their recompute)."""

    def pick(self, held: Sequence[Held], blocked: Blocked) -> tuple[str, ...]:
        lower = sorted((h for h in held if h.priority > blocked.priority),
                       key=lambda h: (h.priority, h.held_at), reverse=True)
        chosen, freed = [], 0
        for prompt in lower:
            if freed >= blocked.short:
                break
            chosen.append(prompt.request_id)
            freed += prompt.blocks
        return tuple(chosen) if freed >= blocked.short else ()


class KeepHeld(HeldVictims):
    """Never give a held prompt back: a queued request waits for the reservations."""

    def pick(self, held: Sequence[Held], blocked: Blocked) -> tuple[str, ...]:
        return ()

