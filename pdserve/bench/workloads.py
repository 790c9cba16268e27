"""Deterministic workloads: which prompts arrive when, at which priority, wanting how many tokens.

    chat           short chats only, NORMAL and VIP: the interference-free baseline
    mixed          exactly the chats of `chat` (same seed) plus a few long documents (BATCH)
                   arriving evenly among them
    shared-prefix  one long common document followed by many short questions (RAG)

Arrivals are a Poisson process (exponential gaps at `rate` per second), the first at t = 0.
Prompt text and arrival times come from separate seeded generators, so changing the rate keeps
the prompts. Every request is greedy with `ignore_eos`, so its output length is exactly
`max_tokens` whatever the model says.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, replace

from pdserve.bench import text
from pdserve.requests import Priority


class Kind(enum.Enum):
    CHAT = "chat"
    DOCUMENT = "document"
    QUESTION = "question"


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


@dataclass(frozen=True)
class DocumentShape:
    words: tuple[int, int] = (1400, 1650)  # about 1,500-1,800 tokens: seconds of prefill here
    max_tokens: int = 16
    one_in: int = 9  # one document per this many requests, at least one


@dataclass(frozen=True)
class SharedPrefixShape:
    document_words: int = 950  # about 1,050 tokens shared by every request
    question_words: tuple[int, int] = (4, 12)
    max_tokens: tuple[int, int] = (8, 16)


@dataclass(frozen=True)
class Defaults:
    requests: int
    rate: float


DEFAULTS = {"chat": Defaults(24, 0.5), "mixed": Defaults(27, 0.5), "shared-prefix": Defaults(8, 0.1)}
NAMES = tuple(DEFAULTS)


def poisson_arrivals(rng: random.Random, n: int, rate: float) -> list[float]:
    """n arrival times: 0, then exponential gaps of mean 1/rate."""
    times, now = [], 0.0
    for i in range(n):
        if i:
            now += rng.expovariate(rate)
        times.append(now)
    return times


def _numbered(name: str, seed: int, rate: float, drafts: list[BenchRequest]) -> Workload:
    ordered = sorted(drafts, key=lambda r: r.arrival_s)
    return Workload(name, seed, rate, tuple(replace(r, index=i) for i, r in enumerate(ordered)))


def _chats(n: int, rate: float, seed: int, shape: ChatShape) -> list[BenchRequest]:
    rng = random.Random(f"chat:{seed}:text")
    arrivals = poisson_arrivals(random.Random(f"chat:{seed}:arrivals"), n, rate)
    drafts = []
    for at in arrivals:
        vip = rng.random() < shape.vip_fraction
        prompt = text.paragraph(rng, rng.randint(*shape.prompt_words))
        drafts.append(BenchRequest(0, at, Kind.CHAT, Priority.VIP if vip else Priority.NORMAL, prompt,
                                   rng.randint(*shape.max_tokens)))
    return drafts


def chat(n: int, rate: float, seed: int, shape: ChatShape = ChatShape()) -> Workload:
    return _numbered("chat", seed, rate, _chats(n, rate, seed, shape))


def document_count(n: int, shape: DocumentShape = DocumentShape()) -> int:
    return max(1, n // shape.one_in)


def mixed(n: int, rate: float, seed: int, chats: ChatShape = ChatShape(),
          docs: DocumentShape = DocumentShape()) -> Workload:
    """The chats of `chat(n - d, rate, seed)` plus d documents at evenly spaced times among them."""
    d = min(document_count(n, docs), n)
    drafts = _chats(n - d, rate, seed, chats)
    span = max((r.arrival_s for r in drafts), default=0.0)
    rng = random.Random(f"document:{seed}:text")
    for k in range(d):
        body = text.paragraph(rng, rng.randint(*docs.words))
        prompt = f"Summarise the following document in one sentence.\n\n{body}\n\nSummary:"
        drafts.append(BenchRequest(0, span * (k + 0.5) / d, Kind.DOCUMENT, Priority.BATCH, prompt, docs.max_tokens))
    return _numbered("mixed", seed, rate, drafts)


def shared_prefix(n: int, rate: float, seed: int, shape: SharedPrefixShape = SharedPrefixShape()) -> Workload:
    rng = random.Random(f"shared-prefix:{seed}:text")
    document = text.paragraph(rng, shape.document_words)
    arrivals = poisson_arrivals(random.Random(f"shared-prefix:{seed}:arrivals"), n, rate)
    drafts = []
    for at in arrivals:
        prompt = f"{document}\n\nQuestion: {text.question(rng, rng.randint(*shape.question_words))}\nAnswer:"
        drafts.append(BenchRequest(0, at, Kind.QUESTION, Priority.NORMAL, prompt, rng.randint(*shape.max_tokens)))
    return _numbered("shared-prefix", seed, rate, drafts)


def build(name: str, requests: int | None = None, rate: float | None = None, seed: int = 0) -> Workload:
    """A workload by name, with its default size and rate unless given."""
    if name not in DEFAULTS:
        raise ValueError(f"unknown workload {name!r}; one of {', '.join(NAMES)}")
    n = DEFAULTS[name].requests if requests is None else requests
    r = DEFAULTS[name].rate if rate is None else rate
    if n < 1 or r <= 0:
        raise ValueError(f"need at least one request and a positive rate, got {n} and {r}")
    builders = {"chat": chat, "mixed": mixed, "shared-prefix": shared_prefix}
    return builders[name](n, r, seed)
