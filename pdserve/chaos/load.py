"""The chaos load: concurrent chat streams of mixed priority and length, optionally long documents.

Built from the bench workloads (same prompts for the same seed). A quarter of the chats are VIP
and some BATCH (documents are BATCH); half of all requests, picked by the seed, are sampled
(temperature > 0 with a per-request seed), the others greedy. Every request ignores EOS, so a
completed output has exactly `max_tokens` tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from pdserve.bench import workloads
from pdserve.bench.schedule import by_arrival
from pdserve.bench.workloads import BenchRequest, Workload
from pdserve.requests import Priority


@dataclass(frozen=True)
class LoadSpec:
    streams: int = 40  # chats
    documents: int = 0
    chat_words: tuple[int, int] = (40, 160)
    chat_tokens: tuple[int, int] = (16, 32)
    document_words: tuple[int, int] = (1750, 1850)
    document_tokens: int = 16
    vip_fraction: float = 0.25
    batch_fraction: float = 0.125  # of the chats
    sampled_fraction: float = 0.5
    temperature: float = 0.8
    rate: float | None = None  # arrivals per second (Poisson); None: every request at t = 0


def build(spec: LoadSpec, seed: int) -> Workload:
    """The same spec and seed give the same requests, in the same order."""
    chats = workloads.chat(spec.streams, spec.rate or 1.0, seed,
                           workloads.ChatShape(spec.chat_words, spec.chat_tokens, spec.vip_fraction)).requests
    if spec.rate is None:
        chats = tuple(replace(r, arrival_s=0.0) for r in chats)
    docs = workloads.documents(random.Random(f"chaos-document:{seed}"), spec.documents, chats,
                               workloads.DocumentShape(spec.document_words, spec.document_tokens))
    drafts = _with_sampling(by_arrival(_with_batch(chats, spec, seed), docs), spec, seed)
    return Workload("chaos", seed, spec.rate or 0.0, tuple(replace(r, index=i) for i, r in enumerate(drafts)))


def _with_batch(chats: tuple[BenchRequest, ...], spec: LoadSpec, seed: int) -> list[BenchRequest]:
    rng = random.Random(f"chaos-batch:{seed}")
    normal = [r.index for r in chats if r.priority is Priority.NORMAL]
    batch = set(rng.sample(normal, min(len(normal), round(spec.batch_fraction * len(chats)))))
    return [replace(r, priority=Priority.BATCH) if r.index in batch else r for r in chats]


def _with_sampling(drafts: list[BenchRequest], spec: LoadSpec, seed: int) -> list[BenchRequest]:
    rng = random.Random(f"chaos-sampling:{seed}")
    sampled = set(rng.sample(range(len(drafts)), round(spec.sampled_fraction * len(drafts))))
    return [replace(r, temperature=spec.temperature, seed=rng.randrange(2**31)) if i in sampled else r
            for i, r in enumerate(drafts)]


def is_sampled(request: BenchRequest) -> bool:
    return request.temperature > 0
