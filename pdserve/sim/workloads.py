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
    validate       the small workload `--validate` runs on the real engine and in the simulator
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.requests import Priority, Request, SamplingParams

FAKE_TOKEN = 11  # the token every simulated step samples (never an end-of-sequence id)
_FILLER = 13
_PRIVATE_BASE = 9_000  # + request index: below every model's vocabulary for < 40,000 requests


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


def _poisson_times(rng: random.Random, count: int, rate: float, start: float = 0.0) -> list[float]:
    t, times = start, []
    for _ in range(count):
        t += rng.expovariate(rate)
        times.append(t)
    return times


def _chats(rng: random.Random, count: int, rate: float, prompt: int, output: int,
           vip_share: float = 0.2) -> list[RequestSpec]:
    times = _poisson_times(rng, count, rate)
    return [RequestSpec(f"chat-{i:03d}", t, prompt, output,
                        Priority.VIP if rng.random() < vip_share else Priority.NORMAL, "chat")
            for i, t in enumerate(times)]


def _documents(count: int, first_s: float, every_s: float, prompt: int, output: int) -> list[RequestSpec]:
    return [RequestSpec(f"doc-{i:02d}", first_s + i * every_s, prompt, output, Priority.BATCH, "document")
            for i in range(count)]


def _workload(name: str, specs: list[RequestSpec], description: str) -> Workload:
    return Workload(name, tuple(sorted(specs, key=lambda r: r.arrival_s)), description)


def seed_workload(seed: int = 0, chat_rate: float = 4.0, doc_every_s: float = 4.0) -> Workload:
    rng = random.Random(seed)
    chats = _chats(rng, 100, chat_rate, 1024, 256)
    docs = _documents(10, 1.0, doc_every_s, 65_536, 512)
    return _workload("seed", chats + docs, f"100 chats (1K prompt, 256 out, Poisson {chat_rate:g}/s, 20% VIP) "
                     f"+ 10 documents (64K prompt, 512 out, BATCH, every {doc_every_s:g} s from 1 s)")


def seed_burst_workload(seed: int = 0, chat_rate: float = 20.0) -> Workload:
    rng = random.Random(seed)
    chats = _chats(rng, 100, chat_rate, 1024, 256)
    docs = _documents(10, 0.5, 0.0, 65_536, 512)
    return _workload("seed-burst", chats + docs, f"100 chats (1K prompt, 256 out, Poisson {chat_rate:g}/s, "
                     "20% VIP) + 10 documents (64K prompt, 512 out, BATCH) together at 0.5 s")


def chat_workload(seed: int = 0, chat_rate: float = 4.0) -> Workload:
    rng = random.Random(seed)
    return _workload("chat", _chats(rng, 100, chat_rate, 1024, 256),
                     f"100 chats (1K prompt, 256 out, Poisson {chat_rate:g}/s, 20% VIP)")


def mixed_workload(seed: int = 0, chat_rate: float = 4.0) -> Workload:
    rng = random.Random(seed)
    chats = _chats(rng, 40, chat_rate, 512, 128)
    docs = _documents(3, 1.0, 3.0, 16_384, 256)
    return _workload("mixed", chats + docs, f"40 chats (512 prompt, 128 out, Poisson {chat_rate:g}/s) "
                     "+ 3 documents (16K prompt, 256 out, BATCH, every 3 s from 1 s)")


def shared_prefix_workload(seed: int = 0, chat_rate: float = 8.0) -> Workload:
    rng = random.Random(seed)
    times = _poisson_times(rng, 64, chat_rate)
    specs = [RequestSpec(f"q-{i:03d}", t, 8192 + 64, 64, Priority.NORMAL, "question", shared_prefix_tokens=8192)
             for i, t in enumerate(times)]
    return _workload("shared-prefix", specs, f"64 questions (8K shared document + 64 tokens, 64 out, "
                     f"Poisson {chat_rate:g}/s)")


def validation_workload(seed: int = 0, chat_rate: float = 2.0) -> Workload:
    """Sized for this CPU: 8 chats of ~100-token prompts and 2 prompts of 600 tokens."""
    rng = random.Random(seed)
    times = _poisson_times(rng, 8, chat_rate, start=0.2)
    chats = [RequestSpec(f"chat-{i}", t, rng.randint(90, 110), 24, Priority.NORMAL, "chat")
             for i, t in enumerate(times)]
    longs = [RequestSpec(f"long-{i}", 0.5 + 1.5 * i, 600, 8, Priority.BATCH, "document") for i in range(2)]
    return _workload("validate", chats + longs, "8 chats (~100 prompt, 24 out, Poisson 2/s) "
                     "+ 2 prompts of 600 tokens (8 out) at 0.5 s and 2 s")


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "seed": seed_workload,
    "seed-burst": seed_burst_workload,
    "chat": chat_workload,
    "mixed": mixed_workload,
    "shared-prefix": shared_prefix_workload,
    "validate": validation_workload,
}


def get_workload(name: str, seed: int = 0, chat_rate: float | None = None) -> Workload:
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {sorted(WORKLOADS)}")
    build = WORKLOADS[name]
    return build(seed) if chat_rate is None else build(seed, chat_rate)
