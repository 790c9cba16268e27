"""The schedule of a load: when each request arrives, whether it is a chat, a document or a
question, its priority, how large its prompt is and how many tokens it asks for.

One generator for `pdserve bench` (pdserve/bench/workloads.py, which renders a prompt as text of
so many words, text.py) and `pdserve simulate` (pdserve/sim/workloads.py, a count of tokens):

    times   = poisson_times(rng, count, rate)    seeded Poisson arrivals (or `spread`, `every`)
    planned = plan(stream, times, rng, render)   per request, in this order from `rng`:
                                                 priority, prompt size, render(rng, size), output size
    merged  = by_arrival(chats, documents)       ties keep the order given

`Fixed` sizes and `Always` priorities take no draw, so a stream of them draws nothing. Arrivals
come from the generator handed to `poisson_times`: the bench gives them one of their own (the
prompts stay when the rate changes), the simulator the one its sizes draw from afterwards.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from pdserve.requests import Priority

P = TypeVar("P")


class Kind(enum.Enum):
    CHAT = "chat"
    DOCUMENT = "document"
    QUESTION = "question"


@dataclass(frozen=True)
class Fixed:
    value: int

    def draw(self, rng: random.Random) -> int:
        return self.value


@dataclass(frozen=True)
class Uniform:
    low: int
    high: int  # inclusive

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)


@dataclass(frozen=True)
class Always:
    priority: Priority

    def draw(self, rng: random.Random) -> Priority:
        return self.priority


@dataclass(frozen=True)
class VipShare:
    """VIP with probability `share`, else NORMAL (one draw even at 0)."""

    share: float

    def draw(self, rng: random.Random) -> Priority:
        return Priority.VIP if rng.random() < self.share else Priority.NORMAL


@dataclass(frozen=True)
class Stream:
    """One class of requests: what each of them is, its arrival time apart."""

    kind: Kind
    priority: Always | VipShare
    prompt: Fixed | Uniform  # in the renderer's unit: words (bench) or tokens (simulator)
    output: Fixed | Uniform  # tokens


@dataclass(frozen=True)
class Planned(Generic[P]):
    number: int  # its place in its stream, from 0
    arrival_s: float
    kind: Kind
    priority: Priority
    prompt: P  # as rendered
    output_tokens: int


class Arriving(Protocol):
    @property
    def arrival_s(self) -> float: ...


A = TypeVar("A", bound=Arriving)


def poisson_times(rng: random.Random, count: int, rate: float, start_s: float = 0.0,
                  first_at_start: bool = False) -> list[float]:
    """`count` arrivals with exponential gaps of mean 1/rate from `start_s`; the first at `start_s`
    itself where `first_at_start` (the bench), else one gap after it (the simulator)."""
    times, now = [], start_s
    for i in range(count):
        if i or not first_at_start:
            now += rng.expovariate(rate)
        times.append(now)
    return times


def spread(span_s: float, count: int) -> list[float]:
    """`count` times evenly among [0, span_s], each in the middle of its share."""
    return [span_s * (k + 0.5) / count for k in range(count)]


def every(first_s: float, gap_s: float, count: int) -> list[float]:
    return [first_s + i * gap_s for i in range(count)]


def plan(stream: Stream, times: Iterable[float], rng: random.Random,
         render: Callable[[random.Random, int], P]) -> list[Planned[P]]:
    """One request of `stream` at each time, drawn from `rng` in the order the docstring gives."""
    planned = []
    for number, at in enumerate(times):
        priority = stream.priority.draw(rng)
        prompt = render(rng, stream.prompt.draw(rng))
        planned.append(Planned(number, at, stream.kind, priority, prompt, stream.output.draw(rng)))
    return planned


def by_arrival(*streams: Iterable[A]) -> list[A]:
    """Every request of `streams` by arrival time; equal times keep the order given."""
    return sorted((r for stream in streams for r in stream), key=lambda r: r.arrival_s)
