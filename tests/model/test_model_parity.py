"""Greedy decoding through the paged model equals transformers' generate(), token for token."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.paged_driver import PagedDriver
from tests.helpers.reference import hf_greedy
from tests.model.smol_prompts import SMOL_NEW_TOKENS, SMOL_PROMPTS

TINY_NEW_TOKENS = 16
# prompt length -> chunk sizes (None: the whole prompt in one pass)
TINY_RUNS = {5: (None, 1), 33: (None, 1, 7), 100: (None, 7, 64)}
TINY_NAMES = ("llama_gqa_llama3", "qwen2_bias", "llama_untied", "mistral", "qwen3")


def tiny_prompt(length: int, vocab_size: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return [1] + torch.randint(3, vocab_size, (length - 1,), generator=generator).tolist()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(SMOL_PROMPTS))
def test_smollm2_whole_prompt_matches_transformers(smollm2, smollm2_reference_ids, name):
    driver = PagedDriver(smollm2.model, block_size=16, shuffle_seed=7)
    assert driver.greedy(SMOL_PROMPTS[name], SMOL_NEW_TOKENS) == smollm2_reference_ids[name]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("name", "chunk"), [("system_only", 1), ("france", 7), ("summary", 64)])
def test_smollm2_chunked_prefill_matches_transformers(smollm2, smollm2_reference_ids, name, chunk):
    driver = PagedDriver(smollm2.model, block_size=16, shuffle_seed=chunk)
    assert driver.greedy(SMOL_PROMPTS[name], SMOL_NEW_TOKENS, chunk=chunk) == smollm2_reference_ids[name]


def test_smollm2_answers_the_france_question(smollm2):
    """The known answer "The capital of France is Paris." then <|im_end|> (id 2)."""
    generated = PagedDriver(smollm2.model, block_size=16).greedy(SMOL_PROMPTS["france"], 8)
    assert generated == [504, 3575, 282, 4649, 314, 7042, 30, 2]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", TINY_NAMES)
def test_tiny_models_match_transformers(tiny_models, name):
    ours, reference = tiny_models[name]
    for length, chunks in TINY_RUNS.items():
        prompt = tiny_prompt(length, ours.config.vocab_size, seed=length)
        expected = hf_greedy(reference, prompt, TINY_NEW_TOKENS)
        for chunk in chunks:
            driver = PagedDriver(ours.model, block_size=4, shuffle_seed=length)
            got = driver.greedy(prompt, TINY_NEW_TOKENS, chunk=chunk)
            assert got == expected, f"{name}: prompt of {length}, chunk {chunk}"


@pytest.mark.parametrize("name", TINY_NAMES)
@pytest.mark.timeout(900)
def test_tiny_model_logits_close_to_transformers(tiny_models, name):
    ours, reference = tiny_models[name]
    assert_last_logits_close(ours, reference)


def assert_last_logits_close(ours, reference, tokens: int = 50) -> None:
    """A prompt's last logits, ours through the paged driver against transformers' forward."""
    prompt = tiny_prompt(tokens, ours.config.vocab_size, seed=3)
    driver = PagedDriver(ours.model, block_size=8)
    logits = driver.step([(driver.new_sequence(prompt), len(prompt))])[0]
    with torch.inference_mode():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


def test_half_precision_runs_close_to_float32(tiny_model_dirs, tiny_models):
    from pdserve.model import load_model

    prompt = tiny_prompt(20, 384, seed=9)
    full = PagedDriver(tiny_models["qwen2_bias"][0].model, block_size=4)
    half = PagedDriver(load_model(str(tiny_model_dirs["qwen2_bias"]), dtype=torch.bfloat16).model, block_size=4)
    expected = full.step([(full.new_sequence(prompt), 20)])
    got = half.step([(half.new_sequence(prompt), 20)])
    assert got.dtype == torch.bfloat16 and half.kv.data.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=0.05, atol=0.1)
