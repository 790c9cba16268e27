"""The torch-batched attention backend through the whole Engine: greedy tokens equal to the
reference (torch) backend's and to transformers', at batch 1, 64 and 256, with mixed context
lengths and prefix-cache hits. Tiny random models for the big batches, a few steps each."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pdserve.engine.engine import Engine
from pdserve.requests import SamplingParams
from pdserve.tokenizer import ChatMessage
from tests.engine.conftest import SMOL
from tests.engine.driver import Arrival, assert_all_blocks_released, make_engine, run

NEW_TOKENS = 5
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


def engine_with(loaded, backend: str, **kwargs) -> Engine:
    """make_engine's engine with another attention backend."""
    reference = make_engine(loaded, **kwargs)
    config = dataclasses.replace(reference.config, attention_backend=backend)
    return Engine(config, loaded=loaded)


def shared_prefix_prompts(count: int, vocab_size: int, seed: int) -> list[list[int]]:
    """`count` prompts of 6..60 tokens; most start with one of three shared prefixes (9, 16 and
    23 tokens), so requests arriving after the first of a family hit the prefix cache."""
    gen = torch.Generator().manual_seed(seed)
    prefixes = [[1] + torch.randint(3, vocab_size, (n - 1,), generator=gen).tolist() for n in (9, 16, 23)]
    prompts = []
    for i in range(count):
        tail = torch.randint(3, vocab_size, (int(torch.randint(5, 38, (1,), generator=gen)),), generator=gen).tolist()
        prompts.append((prefixes[i % 3] if i % 4 else [1]) + tail)
    return prompts


def run_batch(loaded, backend: str, prompts: list[list[int]]):
    """Half the prompts at step 0, the rest at step 1 (after the first half's prefixes are
    cached), everything prefilled in one step each, then all decoding together."""
    blocks = sum(-(-(len(p) + NEW_TOKENS) // 4) for p in prompts) + 8
    engine = engine_with(loaded, backend, num_blocks=blocks, token_budget=16384, max_chunk_tokens=1024)
    half = len(prompts) // 2
    arrivals = [Arrival(f"r{i}", p, GREEDY, at=0 if i < half else 1) for i, p in enumerate(prompts)]
    trace = run(engine, arrivals)
    assert_all_blocks_released(engine)
    return trace


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("name", "count"), [("llama_gqa_llama3", 64), ("qwen2_bias", 64), ("mistral", 64),
                                             ("llama_gqa_llama3", 256), ("llama_untied", 256)])
def test_big_batches_equal_the_reference_and_transformers(tiny_loaded, oracle, name, count):
    loaded = tiny_loaded[name]
    prompts = shared_prefix_prompts(count, loaded.config.vocab_size, seed=count)
    ours = run_batch(loaded, "torch-batched", prompts)
    assert_big_batch_equal(ours, run_batch(loaded, "torch", prompts), "reference backend", oracle, name, prompts)


def assert_big_batch_equal(ours, other, other_name: str, oracle, name: str, prompts: list[list[int]]) -> None:
    """One step decoded the whole batch, prefixes were hit, and every request's tokens equal
    `other`'s and transformers'."""
    assert max(len(sizes) for sizes in ours.chunk_sizes) == len(prompts)
    assert any(ours.requests[f"r{i}"].num_cached_tokens > 0 for i in range(len(prompts)))
    for i, prompt in enumerate(prompts):
        tokens = ours.tokens(f"r{i}")
        assert tokens == other.tokens(f"r{i}"), f"{name}: request {i} differs from the {other_name}"
        assert tokens == oracle.greedy(name, prompt, NEW_TOKENS), f"{name}: request {i} differs from transformers"


def assert_smollm2_alone_and_mixed_equal_transformers(loaded, tokenizer, oracle, alone_backend: str,
                                                      mixed_backend: str) -> None:
    """Three chat prompts: the first alone, then all three in one batch sharing the template's prefix."""
    questions = ("Hi!", "What is the capital of France?", "Name three colours of the rainbow, please.")
    prompts = [tokenizer.apply_chat_template([ChatMessage("user", q)]) for q in questions]
    alone = run_batch(loaded, alone_backend, prompts[:1])
    assert alone.tokens("r0") == oracle.greedy(SMOL, prompts[0], NEW_TOKENS)
    mixed = run_batch(loaded, mixed_backend, prompts)
    assert any(mixed.requests[f"r{i}"].num_cached_tokens > 0 for i in range(len(prompts)))
    for i, prompt in enumerate(prompts):
        assert mixed.tokens(f"r{i}") == oracle.greedy(SMOL, prompt, NEW_TOKENS), questions[i]


@pytest.mark.timeout(600)
def test_smollm2_batch_one_and_a_mixed_batch_equal_transformers(smol_loaded, smol_tokenizer, oracle):
    assert_smollm2_alone_and_mixed_equal_transformers(smol_loaded, smol_tokenizer, oracle, "torch-batched",
                                                      "torch-batched")


def test_chunked_prefill_beside_decodes_equals_the_reference(tiny_loaded):
    """Small budget: prefill chunks after a cached prefix share steps with decodes."""
    loaded = tiny_loaded["llama_gqa_llama3"]
    prompts = shared_prefix_prompts(12, loaded.config.vocab_size, seed=7)
    traces = {}
    for backend in ("torch-batched", "torch"):
        engine = engine_with(loaded, backend, num_blocks=512, token_budget=40, max_chunk_tokens=16)
        arrivals = [Arrival(f"r{i}", p, GREEDY, at=i) for i, p in enumerate(prompts)]
        traces[backend] = run(engine, arrivals)
        assert_all_blocks_released(engine)
    for i in range(len(prompts)):
        assert traces["torch-batched"].tokens(f"r{i}") == traces["torch"].tokens(f"r{i}")
