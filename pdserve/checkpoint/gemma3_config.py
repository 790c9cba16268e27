"""Gemma 3's config beyond Llama's, from config.json or GGUF metadata, as ModelConfig fields.

    what                  config.json                                  GGUF (as llama.cpp reads it)
    windowed layers       layer_types[i] == "sliding_attention", else  every layer but each 6th
                          (i + 1) % sliding_window_pattern (6)         ((i + 1) % 6 != 0)
    window                sliding_window                               gemma3.attention.sliding_window
    global rotary         rope_parameters.full_attention, or           gemma3.rope.freq_base (+ linear
                          rope_theta + rope_scaling (1e6)              scaling where written)
    local rotary base     rope_parameters.sliding_attention, or        10000 (fixed)
                          rope_local_base_freq (10000)
    attention scale       query_pre_attn_scalar ** -0.5                1 / sqrt(head_dim); the 27B
                                                                       (62 layers): 1 / sqrt(hidden / heads)
    norms, MLP            (1 + w) RMS norms, gelu_pytorch_tanh         the same (the file stores 1 + w)
    embeddings            times sqrt(hidden), tied                     the same
    final logits          final_logit_softcapping (none in Gemma 3)    gemma3.final_logit_softcapping
    end of generation     eos_token_id; generation_config.json's       EOS, and <end_of_turn> where the
                          [1, 106]: <eos>, <end_of_turn>               vocabulary has it (llama.cpp finds
                                                                       a file's end of turn by its text)

Attention-logit softcapping (Gemma 2's) and bidirectional attention (EmbeddingGemma) are refused.
"""

from __future__ import annotations

from typing import Any

from pdserve.checkpoint.errors import UnsupportedModelError
from pdserve.checkpoint.model_config import Activation, ModelConfig, NormStyle

SLIDING_WINDOW_PATTERN = 6  # transformers' default and llama.cpp's fixed one: each 6th layer global
LOCAL_ROPE_THETA = 10000.0
GLOBAL_ROPE_THETA = 1_000_000.0
QUERY_PRE_ATTN_SCALAR = 256  # transformers' default
LAYER_KINDS = ("sliding_attention", "full_attention")
GELU_TANH_NAMES = ("gelu_pytorch_tanh",)
GGUF_27B_LAYERS = 62  # llama.cpp scales the 27B's scores by its hidden size per head, not head_dim
END_OF_TURN = "<end_of_turn>"


def gemma3_from_hf(raw: dict[str, Any], base: ModelConfig) -> dict[str, Any]:
    """ModelConfig fields (to replace in `base`, read as a Llama config.json) for a Gemma 3 one."""
    name = base.name
    _refuse(raw.get("attn_logit_softcapping"), raw.get("use_bidirectional_attention"), name)
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or GELU_TANH_NAMES[0]
    if activation not in GELU_TANH_NAMES:
        raise UnsupportedModelError(f"{name}: hidden activation {activation!r} is not supported (gelu_pytorch_tanh is)")
    window = raw.get("sliding_window")
    locals_ = _hf_local_layers(raw, base.num_layers, name)
    local_rope = (raw.get("rope_parameters") or {}).get("sliding_attention") or {}
    if local_rope.get("rope_type", "default") != "default":
        raise UnsupportedModelError(f"{name}: rope scaling on the sliding-window layers is not supported")
    scalar = raw.get("query_pre_attn_scalar", QUERY_PRE_ATTN_SCALAR)
    return {
        **_common(base, window, locals_, _softcap(raw.get("final_logit_softcapping")), float(scalar)),
        "rope_theta": _hf_global_theta(raw, base.rope_theta),
        "local_rope_theta": float(local_rope.get("rope_theta", raw.get("rope_local_base_freq", LOCAL_ROPE_THETA))),
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", True)),
    }


def gemma3_from_gguf(meta: dict[str, Any], base: ModelConfig) -> dict[str, Any]:
    """ModelConfig fields (to replace in `base`, read as a Llama file) for a `gemma3` file."""
    _refuse(meta.get("gemma3.attn_logit_softcapping"), False, base.name)
    window = meta.get("gemma3.attention.sliding_window")
    locals_ = pattern_local_layers(base.num_layers, SLIDING_WINDOW_PATTERN)
    per_head = base.hidden_size // base.num_heads if base.num_layers == GGUF_27B_LAYERS else base.head_dim
    return {
        **_common(base, window, locals_, _softcap(meta.get("gemma3.final_logit_softcapping")), float(per_head)),
        "local_rope_theta": float(meta.get("gemma3.rope.freq_base_swa", LOCAL_ROPE_THETA)),
        "eos_token_ids": gguf_end_ids(meta, base.eos_token_ids),
    }


def gguf_end_ids(meta: dict[str, Any], eos: tuple[int, ...]) -> tuple[int, ...]:
    """`eos` (a file's end-of-generation ids) and, in a `gemma3` file, the id of <end_of_turn>."""
    if meta.get("general.architecture") != "gemma3":
        return eos
    tokens = meta.get("tokenizer.ggml.tokens") or []
    turn = [tokens.index(END_OF_TURN)] if END_OF_TURN in tokens else []
    return tuple(dict.fromkeys([*eos, *turn]))


def pattern_local_layers(num_layers: int, pattern: int) -> tuple[bool, ...]:
    """Windowed (local) or not, per layer: all but each `pattern`-th."""
    return tuple((i + 1) % pattern != 0 for i in range(num_layers))


def _common(base: ModelConfig, window: Any, locals_: tuple[bool, ...], softcap: float | None,
            scalar: float) -> dict[str, Any]:
    windows = tuple(int(window) if local else None for local in locals_) if window else ()
    return {
        "norm_style": NormStyle.GEMMA,
        "activation": Activation.GELU_TANH,
        "embedding_scale": base.hidden_size**0.5,
        "attention_scale": None if scalar == base.head_dim else scalar**-0.5,
        "layer_windows": windows,
        "final_logit_softcap": softcap,
    }


def _hf_local_layers(raw: dict[str, Any], num_layers: int, name: str) -> tuple[bool, ...]:
    kinds = raw.get("layer_types")
    if kinds is None:
        return pattern_local_layers(num_layers, int(raw.get("sliding_window_pattern", SLIDING_WINDOW_PATTERN)))
    if len(kinds) != num_layers or any(k not in LAYER_KINDS for k in kinds):
        raise UnsupportedModelError(f"{name}: layer_types must name {num_layers} layers of {', '.join(LAYER_KINDS)}")
    return tuple(k == "sliding_attention" for k in kinds)


def _hf_global_theta(raw: dict[str, Any], parsed: float) -> float:
    """The global layers' base: `parsed` where the config names one, else Gemma 3's 1e6."""
    params = raw.get("rope_parameters") or {}
    named = "rope_theta" in raw or "rope_theta" in (params.get("full_attention") or {})
    return parsed if named else GLOBAL_ROPE_THETA


def _refuse(attn_softcap: Any, bidirectional: Any, name: str) -> None:
    if attn_softcap is not None:
        raise UnsupportedModelError(f"{name}: attention-logit softcapping is not supported")
    if bidirectional:
        raise UnsupportedModelError(f"{name}: bidirectional attention (an embedding model) is not supported")


def _softcap(value: Any) -> float | None:
    return None if value is None else float(value)
