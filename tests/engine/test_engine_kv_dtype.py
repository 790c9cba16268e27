"""A half KV pool below the float32 embedded model (`--kv-cache-dtype bfloat16 | float16`).

The oracle is transformers with its own cache rounding every key and value to the same dtype as it
stores them (tests/helpers/reference.py `rounding_cache`): its attention over the rounded values is
what the pool's must compute. Greedy outputs of our engine (the reference backend, and
torch-batched: the C kernel reading the half pool, the fused decode step writing it) follow
transformers' token for token, except where transformers' two best tokens lie within
MARGIN_TOLERANCE of each other: rounding to 8 (bfloat16) or 11 (float16) significant bits turns on
float32 sums that differ in their last bits between the two implementations, and a key near a
rounding boundary lands on one side or the other, so near a tie the two may part (measured here:
a bfloat16 run parted at a gap of 0.006, its log-probabilities moved by about that much).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pdserve.config import CacheConfig, EngineConfig
from pdserve.engine.llm import LLM
from pdserve.requests import SamplingParams
from pdserve.tokenizer import load_tokenizer
from tests.helpers.reference import hf_greedy, parted_off_a_tie

pytestmark = pytest.mark.timeout(600)

MARGIN_TOLERANCE = 0.05
NEW_TOKENS = 24
PROMPTS = ("The capital of France is", "Write a long story about a dragon who", "def fibonacci(n):")


@pytest.fixture(scope="module")
def hf():
    from pdserve.checkpoint.embedded import embedded_model_path
    from tests.helpers.hf_models import load_hf_model

    return load_hf_model(embedded_model_path())


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = load_tokenizer(None)
    return [tokenizer.encode(p) for p in PROMPTS]


@pytest.mark.parametrize(("kv_dtype", "backend"), [("bfloat16", "torch-batched"), ("float16", "torch-batched"),
                                                   ("bfloat16", "torch")])
def test_greedy_follows_transformers_over_a_cache_rounded_alike(hf, prompts, kv_dtype, backend):
    dtype = getattr(torch, kv_dtype)
    llm = LLM(EngineConfig(attention_backend=backend,
                           cache=CacheConfig(num_blocks=64, num_host_blocks=0, kv_dtype=kv_dtype)))
    try:
        assert llm.engine.kv.data.dtype == dtype
        outputs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True))
    finally:
        llm.close()
    for prompt, output in zip(prompts, outputs):
        theirs = hf_greedy(hf, prompt, NEW_TOKENS, dtype)
        problem = parted_off_a_tie(hf, prompt, list(output.token_ids), theirs, dtype, MARGIN_TOLERANCE)
        assert problem is None, problem


def test_a_half_pool_holds_half_the_bytes_of_a_float32_one():
    cache = CacheConfig(num_blocks=8, num_host_blocks=4)
    full, half = (LLM(EngineConfig(attention_backend="torch", cache=dataclasses.replace(cache, kv_dtype=d)))
                  for d in ("auto", "bfloat16"))
    try:
        assert full.engine.kv.data.dtype == torch.float32 and half.engine.kv.data.dtype == torch.bfloat16
        assert 2 * half.engine.kv.block_nbytes == full.engine.kv.block_nbytes
        assert 2 * half.engine.host_kv.data.nbytes == full.engine.host_kv.data.nbytes  # the swap pool too
    finally:
        full.close()
        half.close()
