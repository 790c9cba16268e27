"""A llama.cpp GGUF file's metadata -> ModelConfig, and its tensors under transformers' names, in
numpy and pure Python (the file read by gguf_file.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pdserve.checkpoint.errors import ModelLoadError, UnsupportedModelError
from pdserve.checkpoint.gguf_dequant import dequantize
from pdserve.checkpoint.gguf_file import GGUFFile, GGUFFormatError, GGUFTensor
from pdserve.checkpoint.model_config import Architecture, ModelConfig
from pdserve.checkpoint.rope_scaling import FreqFactorRopeScaling, LinearRopeScaling, NoRopeScaling, RopeScaling

SUPPORTED_ARCHITECTURES = ("llama",)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def open_gguf(path: Path) -> GGUFFile:
    try:
        return GGUFFile(path)
    except GGUFFormatError as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({exc})") from exc


def hf_named_tensors(file: GGUFFile) -> dict[str, GGUFTensor]:
    """The file's tensor entries under transformers' names."""
    return {hf_name(name): tensor for name, tensor in file.tensors.items()}


def dequantize_rows(file: GGUFFile, tensor: GGUFTensor, raw: np.ndarray) -> np.ndarray:
    """`raw` (rows of `tensor`, [rows, row_bytes]) -> [rows, row elements] float32."""
    try:
        return dequantize(raw, tensor.kind)
    except NotImplementedError as exc:
        raise UnsupportedModelError(f"{file.path}: tensor {tensor.name} type {tensor.kind.name}: {exc}") from exc


def gguf_config(file: GGUFFile, tensors: dict[str, GGUFTensor], fallback_name: str) -> ModelConfig:
    """The model config from the file's metadata; `tensors` under the transformers names."""
    meta = file.metadata
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(SUPPORTED_ARCHITECTURES)
        raise UnsupportedModelError(f"unsupported GGUF architecture {arch!r}; supported: {supported}")
    key = _keyed(meta, arch)
    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    if int(meta.get(f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise UnsupportedModelError(f"{fallback_name}: partial rotary embedding is not supported")
    max_pos = int(meta.get(f"{arch}.context_length", 4096))
    return ModelConfig(
        architecture=Architecture.LLAMA,
        vocab_size=int(meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=_gguf_rope(file, arch, tensors),
        max_position_embeddings=max_pos,
        tie_word_embeddings="lm_head.weight" not in tensors,
        attention_bias=False,
        bos_token_id=_optional_int(meta.get("tokenizer.ggml.bos_token_id")),
        eos_token_ids=_eos_ids(meta),
        name=str(meta.get("general.name") or fallback_name),
    )


def _keyed(meta: dict[str, Any], arch: str):
    def key(suffix: str) -> Any:
        name = f"{arch}.{suffix}"
        if name not in meta:
            raise ModelLoadError(f"GGUF metadata lacks {name!r}")
        return meta[name]

    return key


def _gguf_rope(file: GGUFFile, arch: str, tensors: dict[str, GGUFTensor]) -> RopeScaling:
    meta = file.metadata
    if "rope_freqs.weight" in tensors:
        factors = tensors["rope_freqs.weight"]
        return FreqFactorRopeScaling(tuple(dequantize_rows(file, factors, file.raw(factors)).flatten().tolist()))
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return NoRopeScaling()
    if kind == "linear":
        return LinearRopeScaling(float(meta[f"{arch}.rope.scaling.factor"]))
    raise UnsupportedModelError(f"GGUF rope scaling {kind!r} is not supported (none, linear, rope_freqs are)")


def _eos_ids(meta: dict[str, Any]) -> tuple[int, ...]:
    ids = [meta.get("tokenizer.ggml.eos_token_id"), meta.get("tokenizer.ggml.eot_token_id")]
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def hf_name(gguf_name: str) -> str:
    """A GGUF tensor's name under transformers' naming (unknown names unchanged)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return gguf_name
