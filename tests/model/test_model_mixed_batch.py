"""One pass mixing prefill chunks at different offsets with other sequences' decode tokens gives
each sequence what it gets when run alone."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.paged_driver import PagedDriver, Sequence

PROMPT_LENGTHS = {"a": 41, "b": 30, "c": 12, "d": 20}
# Each pass: (sequence, tokens) in batch order; decode rows are interleaved with chunk rows.
SCHEDULE = [
    [("c", 12), ("d", 20)],
    [("a", 16), ("c", 1), ("b", 10), ("d", 1)],
    [("c", 1), ("a", 24), ("d", 1), ("b", 15)],
    [("a", 1), ("b", 5), ("c", 1), ("d", 1)],
    [("d", 1), ("c", 1), ("b", 1), ("a", 1)],
    [("b", 1), ("a", 1)],
]


def prompts(vocab_size: int) -> dict[str, list[int]]:
    generator = torch.Generator().manual_seed(11)
    return {k: torch.randint(3, vocab_size, (n,), generator=generator).tolist() for k, n in PROMPT_LENGTHS.items()}


def run_mixed(model, prompt_ids: dict[str, list[int]]) -> dict[str, list[torch.Tensor]]:
    """Logits each sequence receives whenever it reaches the end of its known tokens."""
    driver = PagedDriver(model, block_size=4, shuffle_seed=5)
    seqs = {k: driver.new_sequence(ids) for k, ids in prompt_ids.items()}
    received: dict[str, list[torch.Tensor]] = {k: [] for k in seqs}
    for step in SCHEDULE:
        work = [(seqs[k], n) for k, n in step]
        logits = driver.step(work)
        for (seq, _), (key, _), row in zip(work, step, logits):
            if seq.computed == len(seq.tokens):
                received[key].append(row)
                seq.tokens.append(int(row.argmax()))
    return received


def run_alone(model, prompt: list[int], steps: int) -> list[torch.Tensor]:
    driver = PagedDriver(model, block_size=4)
    seq = Sequence(list(prompt))
    received = [driver.step([(seq, len(prompt))])[0]]
    while len(received) < steps:
        seq.tokens.append(int(received[-1].argmax()))
        received.append(driver.step([(seq, 1)])[0])
    return received


@pytest.mark.parametrize("name", ["llama_gqa_llama3", "qwen2_bias", "mistral"])
def test_tiny_mixed_batch_equals_separate_runs(tiny_models, name):
    model = tiny_models[name][0].model
    prompt_ids = prompts(model.config.vocab_size)
    mixed = run_mixed(model, prompt_ids)
    for key, rows in mixed.items():
        alone = run_alone(model, prompt_ids[key], len(rows))
        assert [int(r.argmax()) for r in rows] == [int(r.argmax()) for r in alone], key
        torch.testing.assert_close(torch.stack(rows), torch.stack(alone), rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(900)
def test_smollm2_mixed_batch_equals_separate_runs(smollm2):
    prompt_ids = prompts(smollm2.config.vocab_size)
    mixed = run_mixed(smollm2.model, prompt_ids)
    for key, rows in mixed.items():
        alone = run_alone(smollm2.model, prompt_ids[key], len(rows))
        assert [int(r.argmax()) for r in rows] == [int(r.argmax()) for r in alone], key
        torch.testing.assert_close(torch.stack(rows), torch.stack(alone), rtol=1e-3, atol=1e-3)
