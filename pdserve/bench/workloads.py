"""Deterministic workloads: which prompts arrive when, at which priority, wanting how many tokens.

    chat           short chats only, NORMAL and VIP: the interference-free baseline
    mixed          exactly the chats of `chat` (same seed) plus a few long documents (BATCH)
                   arriving evenly among them
    shared-prefix  one long common document followed by many short questions (RAG)
    shifting       chats all along, and a burst of documents a third of the way through: the load
                   goes from decode-bound to prefill-bound and back (the elastic fleet's test)

The schedule (arrival times, kinds, priorities, sizes) is drawn by `schedule.py`, the simulator's
too; this module renders each prompt as text of so many words (text.py). Arrivals are a Poisson
process (exponential gaps at `rate` per second), the first at t = 0.
Prompt text and arrival times come from separate seeded generators, so changing the rate keeps
the prompts. Every request is greedy with `ignore_eos`, so its output length is exactly
`max_tokens` whatever the model says.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pdserve.bench import text
from pdserve.bench.schedule import (Always, Fixed, Kind, Planned, Stream, Uniform, VipShare, by_arrival, plan,
                                    poisson_times, spread)
from pdserve.requests import Priority


@dataclass(frozen=True)
class BenchRequest:
    index: int
    arrival_s: float  # seconds after the run starts
    kind: Kind
    priority: Priority
    prompt: str  # sent as raw text
    max_tokens: int
    temperature: float = 0.0  # above 0: sampled, with `seed` when given
    seed: int | None = None


@dataclass(frozen=True)
class Workload:
    name: str
    seed: int
    rate: float
    requests: tuple[BenchRequest, ...]

    def of_kind(self, kind: Kind) -> tuple[BenchRequest, ...]:
        return tuple(r for r in self.requests if r.kind == kind)

    def alone(self, request: BenchRequest) -> Workload:
        """One request of this workload, sent at t = 0 on its own."""
        return Workload(f"{self.name}:{request.index}-alone", self.seed, 0.0, (replace(request, arrival_s=0.0),))


@dataclass(frozen=True)
class ChatShape:
    prompt_words: tuple[int, int] = (30, 120)
    max_tokens: tuple[int, int] = (24, 48)
    vip_fraction: float = 0.25

    def stream(self) -> Stream:
        return Stream(Kind.CHAT, VipShare(self.vip_fraction), Uniform(*self.prompt_words), Uniform(*self.max_tokens))


@dataclass(frozen=True)
class DocumentShape:
    words: tuple[int, int] = (1400, 1650)  # about 1,500-1,800 tokens: seconds of prefill here
    max_tokens: int = 16
    one_in: int = 9  # one document per this many requests, at least one

    def stream(self) -> Stream:
        return Stream(Kind.DOCUMENT, Always(Priority.BATCH), Uniform(*self.words), Fixed(self.max_tokens))


@dataclass(frozen=True)
class SharedPrefixShape:
    document_words: int = 950  # about 1,050 tokens shared by every request
    question_words: tuple[int, int] = (4, 12)
    max_tokens: tuple[int, int] = (8, 16)

    def stream(self) -> Stream:
        return Stream(Kind.QUESTION, Always(Priority.NORMAL), Uniform(*self.question_words), Uniform(*self.max_tokens))


@dataclass(frozen=True)
class Defaults:
    requests: int
    rate: float


DEFAULTS = {"chat": Defaults(24, 0.5), "mixed": Defaults(27, 0.5), "shared-prefix": Defaults(8, 0.1),
            "shifting": Defaults(36, 0.6)}
NAMES = tuple(DEFAULTS)


def _drafts(planned: list[Planned[str]]) -> list[BenchRequest]:
    return [BenchRequest(0, p.arrival_s, p.kind, p.priority, p.prompt, p.output_tokens) for p in planned]


def _numbered(name: str, seed: int, rate: float, *drafts: list[BenchRequest]) -> Workload:
    ordered = by_arrival(*drafts)
    return Workload(name, seed, rate, tuple(replace(r, index=i) for i, r in enumerate(ordered)))


def _arrivals(label: str, seed: int, n: int, rate: float) -> list[float]:
    return poisson_times(random.Random(f"{label}:{seed}:arrivals"), n, rate, first_at_start=True)


def _chats(n: int, rate: float, seed: int, shape: ChatShape) -> list[BenchRequest]:
    return _drafts(plan(shape.stream(), _arrivals("chat", seed, n, rate), random.Random(f"chat:{seed}:text"),
                        text.paragraph))


def chat(n: int, rate: float, seed: int, shape: ChatShape = ChatShape()) -> Workload:
    return _numbered("chat", seed, rate, _chats(n, rate, seed, shape))


def document_count(n: int, shape: DocumentShape = DocumentShape()) -> int:
    return max(1, n // shape.one_in)


def _summarise(rng: random.Random, words: int) -> str:
    return f"Summarise the following document in one sentence.\n\n{text.paragraph(rng, words)}\n\nSummary:"


def documents(rng: random.Random, count: int, among: Sequence[BenchRequest],
              shape: DocumentShape = DocumentShape()) -> list[BenchRequest]:
    """`count` documents to summarise at evenly spaced times among the arrivals of `among`."""
    span = max((r.arrival_s for r in among), default=0.0)
    return _drafts(plan(shape.stream(), spread(span, count), rng, _summarise))


def mixed(n: int, rate: float, seed: int, chats: ChatShape = ChatShape(),
          docs: DocumentShape = DocumentShape()) -> Workload:
    """The chats of `chat(n - d, rate, seed)` plus d documents at evenly spaced times among them."""
    d = min(document_count(n, docs), n)
    drafts = _chats(n - d, rate, seed, chats)
    return _numbered("mixed", seed, rate, drafts, documents(random.Random(f"document:{seed}:text"), d, drafts, docs))


@dataclass(frozen=True)
class BurstShape:
    """The documents of `shifting`: so many, one every `gap_s`, from a third of the chats' span."""

    one_in: int = 7  # one document per this many requests, at least two (one in a workload of two)
    gap_s: float = 0.5


def shifting(n: int, rate: float, seed: int, chats: ChatShape = ChatShape(), docs: DocumentShape = DocumentShape(),
             burst: BurstShape = BurstShape()) -> Workload:
    """A mix that shifts: n requests, the chats of `chat(n - d, rate, seed)` all along and a burst of
    d documents a third of the way through, so the load goes from decode-bound to prefill-bound
    and back."""
    count = min(n - 1, max(2, n // burst.one_in)) if n > 2 else 1
    drafts = _chats(n - count, rate, seed, chats)
    span = max((r.arrival_s for r in drafts), default=0.0)
    times = [span / 3 + k * burst.gap_s for k in range(count)]
    documents = _drafts(plan(docs.stream(), times, random.Random(f"document:{seed}:text"), _summarise))
    return _numbered("shifting", seed, rate, drafts, documents)


def shared_prefix(n: int, rate: float, seed: int, shape: SharedPrefixShape = SharedPrefixShape()) -> Workload:
    rng = random.Random(f"shared-prefix:{seed}:text")
    document = text.paragraph(rng, shape.document_words)

    def ask(rng: random.Random, words: int) -> str:
        return f"{document}\n\nQuestion: {text.question(rng, words)}\nAnswer:"

    questions = plan(shape.stream(), _arrivals("shared-prefix", seed, n, rate), rng, ask)
    return _numbered("shared-prefix", seed, rate, _drafts(questions))


def build(name: str, requests: int | None = None, rate: float | None = None, seed: int = 0) -> Workload:
    """A workload by name, with its default size and rate unless given."""
    if name not in DEFAULTS:
        raise ValueError(f"unknown workload {name!r}; one of {', '.join(NAMES)}")
    n = DEFAULTS[name].requests if requests is None else requests
    r = DEFAULTS[name].rate if rate is None else rate
    if n < 1 or r <= 0:
        raise ValueError(f"need at least one request and a positive rate, got {n} and {r}")
    builders = {"chat": chat, "mixed": mixed, "shared-prefix": shared_prefix, "shifting": shifting}
    return builders[name](n, r, seed)
