"""Engines over the embedded model (or a model folder) for the GPU checks, and a driver that
steps one until every request is done, keeping tokens, top-2 gaps and preemptions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pdserve.config import CacheConfig, EngineConfig, PreemptionConfig, SchedulerConfig
from pdserve.engine.engine import Engine
from pdserve.requests import PreemptionMode, SamplingParams
from pdserve.tokenizer import ChatMessage, load_tokenizer

BLOCK_SIZE = 16


@dataclass(frozen=True)
class Ask:
    """One greedy request; `resumed`: tokens already produced (re-prefilled, then one more)."""

    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    resumed: tuple[int, ...] = ()


@dataclass
class Outcome:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    gaps: dict[str, list[float]] = field(default_factory=dict)  # per token: top-1 minus top-2 logprob
    swaps: int = 0
    recomputes: int = 0


def engine_for(device: torch.device, model: str | None, dtype: str, backend: str, *, num_blocks: int = 1024,
               num_host_blocks: int = 0, preemption: PreemptionConfig = PreemptionConfig(),
               tensor_parallel_size: int = 1, max_chunk_tokens: int = 1024, deterministic: bool = False) -> Engine:
    cache = CacheConfig(block_size=BLOCK_SIZE, num_blocks=num_blocks, num_host_blocks=num_host_blocks)
    scheduler = SchedulerConfig(token_budget=2048, max_chunk_tokens=max_chunk_tokens, aging_seconds=None,
                                preemption=preemption)
    parallel = {"tensor_parallel_size": tensor_parallel_size} if tensor_parallel_size > 1 else {}
    config = EngineConfig(model=model, device=str(device), dtype=dtype, attention_backend=backend, cache=cache,
                          scheduler=scheduler, deterministic=deterministic, **parallel)
    return Engine(config)


def drive(engine: Engine, asks: Sequence[Ask], max_steps: int = 100_000) -> Outcome:
    outcome = Outcome()
    for ask in asks:
        sampling = SamplingParams(temperature=0.0, max_tokens=ask.max_tokens, ignore_eos=True, logprobs=2)
        engine.add_request(ask.request_id, ask.prompt, sampling, output_token_ids=ask.resumed)
        outcome.tokens[ask.request_id], outcome.gaps[ask.request_id] = [], []
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return outcome
        _record(engine.step(), outcome)
    raise RuntimeError(f"requests unfinished after {max_steps} steps: {engine.scheduler.stats()}")


def _record(result, outcome: Outcome) -> None:
    for out in result.outputs:
        outcome.tokens[out.request_id] += out.new_token_ids
        outcome.gaps[out.request_id] += [lp.top[0][1] - lp.top[1][1] for lp in out.logprobs]
    for preemption in result.preemptions:
        if preemption.mode is PreemptionMode.SWAP:
            outcome.swaps += 1
        else:
            outcome.recomputes += 1


def chat_prompts(model: str | None, questions: Sequence[str]) -> list[tuple[int, ...]]:
    tokenizer = load_tokenizer(model)
    return [tuple(tokenizer.apply_chat_template([ChatMessage("user", q)])) for q in questions]


def no_block_held(engine: Engine) -> bool:
    stats = engine.scheduler.stats()
    return stats.kv.active == 0 and stats.kv.swapped == 0 and stats.kv.free + stats.kv.cached == stats.kv.total
