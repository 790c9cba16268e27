"""transformers as the oracle: greedy continuations computed by its own generate()."""

from __future__ import annotations

import torch


def hf_greedy(model, prompt: list[int], max_new_tokens: int, kv_dtype: torch.dtype | None = None) -> list[int]:
    """Greedy ids after `prompt`, ignoring end-of-sequence so both sides run the same length.
    `kv_dtype`: every key and value rounded to it as the cache stores them (rounding_cache)."""
    model.generation_config.eos_token_id = None
    cache = {} if kv_dtype is None else {"cache": rounding_cache(kv_dtype, model.config)}
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
            **cache,
        )
    return out[0, len(prompt) :].tolist()


def rounding_cache(kv_dtype: torch.dtype, config):
    """transformers' own cache, its keys and values rounded to `kv_dtype` (to nearest) as they are
    stored and attended as the model's dtype: what a half KV pool below a float32 model holds."""
    from transformers import DynamicCache

    class RoundingCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            def rounded(x):
                return x.to(kv_dtype).to(x.dtype)

            return super().update(rounded(key_states), rounded(value_states), layer_idx, *args, **kwargs)

    return RoundingCache(config=config)


def hf_gap(model, ids: list[int], kv_dtype: torch.dtype | None = None) -> float:
    """transformers' gap between its two best log-probabilities after `ids` (over a rounding cache
    where `kv_dtype` is given)."""
    cache = {} if kv_dtype is None else {"cache": rounding_cache(kv_dtype, model.config), "use_cache": True}
    with torch.inference_mode():
        logits = model(torch.tensor([ids]), **cache).logits
    best = torch.log_softmax(logits[0, -1].float(), -1).topk(2).values
    return float(best[0] - best[1])


def parted_off_a_tie(model, prompt: list[int], ours: list[int], theirs: list[int], kv_dtype: torch.dtype | None,
                     margin: float) -> str | None:
    """None when `ours` equals transformers' `theirs`, or parts from it only where transformers'
    two best tokens lay within `margin`; else what went wrong."""
    parted = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if parted is None:
        return None if len(ours) == len(theirs) else f"{len(ours)} tokens, transformers {len(theirs)}"
    gap = hf_gap(model, prompt + theirs[:parted], kv_dtype)
    return None if gap < margin else f"parted from transformers at token {parted}, where its gap was {gap:.4f}"


def hf_last_logits(model, ids: list[int]) -> torch.Tensor:
    """[vocab] logits of the last position, full-sequence forward (no cache)."""
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1].float()
