"""transformers as the oracle: greedy continuations computed by its own generate()."""

from __future__ import annotations

import torch


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy ids after `prompt`, ignoring end-of-sequence so both sides run the same length."""
    model.generation_config.eos_token_id = None
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def hf_last_logits(model, ids: list[int]) -> torch.Tensor:
    """[vocab] logits of the last position, full-sequence forward (no cache)."""
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1].float()
