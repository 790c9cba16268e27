"""Synthetic workloads: who arrives when, with how many prompt and output tokens.

Deterministic for a given seed. A workload is data (frozen `RequestSpec`s); `make_request`
turns a spec into a fresh `Request` for one simulation run, with token ids chosen so that
requests share a cached prefix only where the workload says so (`shared_prefix`).

    seed           100 chats (1,024-token prompts, 256 output tokens, 20% VIP, else NORMAL),
                   Poisson at 4/s, plus 10 documents (65,536-token prompts, 512 output tokens,
                   BATCH) arriving every 4 s from t = 1 s, among and after the chats
    seed-burst     the same requests all at once: chats at 20/s, the 10 documents together at
                   t = 0.5 s (the brief's "when the ten documents arrive together")
    chat           the seed's chats alone: the interference-free baseline
    mixed          the seed's mix scaled down: 40 chats (512 / 128) at 4/s, 3 documents of
                   16,384 tokens (256 output) every 3 s
    shared-prefix  64 questions (64 new tokens, 64 output) after one 8,192-token document,
                   Poisson at 8/s (RAG over one document)
    shifting       a mix that shifts (an elastic split's test): 2,000 chats (512 / 512, 20% VIP) at
                   100/s, then 40 documents (65,536 / 128, BATCH) 4 a second, then 3,000 chats
    validate       the small workload `--validate` runs on the real engine and in the simulator

The schedule (arrival times, priorities, sizes) is drawn by pdserve/bench/schedule.py, the load
generator's too, from one generator per workload seeded with the seed: every arrival first, then
each request's draws; this module renders each prompt as a count of tokens.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.bench.schedule import (Always, Fixed, Kind, Planned, Stream, Uniform, VipShare, by_arrival, every, plan,
                                    poisson_times)
from pdserve.requests import Priority, Request, SamplingParams

FAKE_TOKEN = 11  # the token every simulated step samples (never an end-of-sequence id)
_FILLER = 13
_PRIVATE_BASE = 9_000  # + request index: below every model's vocabulary for < 40,000 requests

SEED_CHATS = Stream(Kind.CHAT, VipShare(0.2), Fixed(1024), Fixed(256))
SEED_DOCUMENTS = Stream(Kind.DOCUMENT, Always(Priority.BATCH), Fixed(65_536), Fixed(512))
MIXED_CHATS = Stream(Kind.CHAT, VipShare(0.2), Fixed(512), Fixed(128))
MIXED_DOCUMENTS = Stream(Kind.DOCUMENT, Always(Priority.BATCH), Fixed(16_384), Fixed(256))
SHARED_DOCUMENT_TOKENS = 8192
QUESTIONS = Stream(Kind.QUESTION, Always(Priority.NORMAL), Fixed(64), Fixed(64))  # after the shared document
SHIFT_CHATS = Stream(Kind.CHAT, VipShare(0.2), Fixed(512), Fixed(512))
SHIFT_DOCUMENTS = Stream(Kind.DOCUMENT, Always(Priority.BATCH), Fixed(65_536), Fixed(128))
VALIDATION_CHATS = Stream(Kind.CHAT, Always(Priority.NORMAL), Uniform(90, 110), Fixed(24))
VALIDATION_LONGS = Stream(Kind.DOCUMENT, Always(Priority.BATCH), Fixed(600), Fixed(8))


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    priority: Priority
    kind: str  # "chat" | "document" | "question": the class the report groups by
    shared_prefix_tokens: int = 0  # leading prompt tokens common to every request with one


@dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[RequestSpec, ...]  # sorted by arrival
    description: str

    def kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.kind for r in self.requests))

    def prompt_tokens(self) -> list[int]:
        return [r.prompt_tokens for r in self.requests]


def make_request(spec: RequestSpec, index: int) -> Request:
    """A fresh Request: a shared prefix (if any), then a first private token unique to
    `index`, then filler, so private parts never match another request's blocks."""
    shared = list(range(100, 100 + spec.shared_prefix_tokens))
    private = spec.prompt_tokens - spec.shared_prefix_tokens
    prompt = shared + [_PRIVATE_BASE + index] + [_FILLER] * (private - 1)
    sampling = SamplingParams(max_tokens=spec.output_tokens, ignore_eos=True)
    return Request(spec.request_id, prompt, sampling, spec.priority, arrival_time=spec.arrival_s)


def _tokens(rng: random.Random, count: int) -> int:
    return count


def _specs(prefix: str, width: int, stream: Stream, times: list[float], rng: random.Random,
           shared: int = 0) -> list[RequestSpec]:
    """`stream` at `times`, named prefix-000 (`width` digits) in stream order; `shared` tokens of a
    common document before each prompt."""
    planned: list[Planned[int]] = plan(stream, times, rng, _tokens)
    return [RequestSpec(f"{prefix}-{p.number:0{width}d}", p.arrival_s, shared + p.prompt, p.output_tokens,
                        p.priority, p.kind.value, shared) for p in planned]


def _chats(rng: random.Random, stream: Stream, count: int, rate: float) -> list[RequestSpec]:
    return _specs("chat", 3, stream, poisson_times(rng, count, rate), rng)


def _documents(rng: random.Random, stream: Stream, times: list[float]) -> list[RequestSpec]:
    return _specs("doc", 2, stream, times, rng)


def _workload(name: str, description: str, *specs: list[RequestSpec]) -> Workload:
    return Workload(name, tuple(by_arrival(*specs)), description)


def seed_workload(seed: int = 0, chat_rate: float = 4.0, doc_every_s: float = 4.0) -> Workload:
    rng = random.Random(seed)
    chats = _chats(rng, SEED_CHATS, 100, chat_rate)
    docs = _documents(rng, SEED_DOCUMENTS, every(1.0, doc_every_s, 10))
    return _workload("seed", f"100 chats (1K prompt, 256 out, Poisson {chat_rate:g}/s, 20% VIP) "
                     f"+ 10 documents (64K prompt, 512 out, BATCH, every {doc_every_s:g} s from 1 s)", chats, docs)


def seed_burst_workload(seed: int = 0, chat_rate: float = 20.0) -> Workload:
    rng = random.Random(seed)
    chats = _chats(rng, SEED_CHATS, 100, chat_rate)
    docs = _documents(rng, SEED_DOCUMENTS, every(0.5, 0.0, 10))
    return _workload("seed-burst", f"100 chats (1K prompt, 256 out, Poisson {chat_rate:g}/s, "
                     "20% VIP) + 10 documents (64K prompt, 512 out, BATCH) together at 0.5 s", chats, docs)


def chat_workload(seed: int = 0, chat_rate: float = 4.0) -> Workload:
    chats = _chats(random.Random(seed), SEED_CHATS, 100, chat_rate)
    return _workload("chat", f"100 chats (1K prompt, 256 out, Poisson {chat_rate:g}/s, 20% VIP)", chats)


def mixed_workload(seed: int = 0, chat_rate: float = 4.0) -> Workload:
    rng = random.Random(seed)
    chats = _chats(rng, MIXED_CHATS, 40, chat_rate)
    docs = _documents(rng, MIXED_DOCUMENTS, every(1.0, 3.0, 3))
    return _workload("mixed", f"40 chats (512 prompt, 128 out, Poisson {chat_rate:g}/s) "
                     "+ 3 documents (16K prompt, 256 out, BATCH, every 3 s from 1 s)", chats, docs)


def shared_prefix_workload(seed: int = 0, chat_rate: float = 8.0) -> Workload:
    rng = random.Random(seed)
    questions = _specs("q", 3, QUESTIONS, poisson_times(rng, 64, chat_rate), rng, SHARED_DOCUMENT_TOKENS)
    return _workload("shared-prefix", f"64 questions (8K shared document + 64 tokens, 64 out, "
                     f"Poisson {chat_rate:g}/s)", questions)


def shifting_workload(seed: int = 0, chat_rate: float = 100.0, chats: tuple[int, int] = (2000, 3000),
                      documents: int = 40, doc_every_s: float = 0.25, chat_stream: Stream = SHIFT_CHATS,
                      doc_stream: Stream = SHIFT_DOCUMENTS) -> Workload:
    """Chats, then a burst of documents 2 s after the last of them, then chats again 2 s after
    the last document: decode-bound, prefill-bound, decode-bound."""
    rng = random.Random(seed)
    before = poisson_times(rng, chats[0], chat_rate)
    burst = every(before[-1] + 2.0, doc_every_s, documents)
    after = poisson_times(rng, chats[1], chat_rate, start_s=burst[-1] + 2.0)
    specs = _specs("chat", 4, chat_stream, before + after, rng)
    return _workload("shifting", f"{chats[0]:,} chats (Poisson {chat_rate:g}/s), then {documents} documents (BATCH, "
                     f"every {doc_every_s:g} s), then {chats[1]:,} chats", specs, _documents(rng, doc_stream, burst))


def validation_workload(seed: int = 0, chat_rate: float = 2.0) -> Workload:
    """Sized for this CPU: 8 chats of ~100-token prompts and 2 prompts of 600 tokens."""
    rng = random.Random(seed)
    chats = _specs("chat", 1, VALIDATION_CHATS, poisson_times(rng, 8, chat_rate, start_s=0.2), rng)
    longs = _specs("long", 1, VALIDATION_LONGS, every(0.5, 1.5, 2), rng)
    return _workload("validate", "8 chats (~100 prompt, 24 out, Poisson 2/s) "
                     "+ 2 prompts of 600 tokens (8 out) at 0.5 s and 2 s", chats, longs)


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "seed": seed_workload,
    "seed-burst": seed_burst_workload,
    "chat": chat_workload,
    "mixed": mixed_workload,
    "shared-prefix": shared_prefix_workload,
    "shifting": shifting_workload,
    "validate": validation_workload,
}


def get_workload(name: str, seed: int = 0, chat_rate: float | None = None) -> Workload:
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {sorted(WORKLOADS)}")
    build = WORKLOADS[name]
    return build(seed) if chat_rate is None else build(seed, chat_rate)
