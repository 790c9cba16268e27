"""A llama.cpp GGUF file's metadata -> ModelConfig, and its tensors under transformers' names, in
numpy and pure Python (the file read by gguf_file.py).

    general.architecture   model          q/k rows as stored            extra tensors per layer
    llama (and Mistral)    Llama          interleaved pairs (permuted)  attn_q/k/v(/output).bias if any
    qwen2                  Qwen2          rotate-half (as transformers) attn_q/k/v.bias
    qwen3                  Qwen3          rotate-half (as transformers) attn_q_norm, attn_k_norm
    gemma3                 Gemma 3        rotate-half (as transformers) attn_q_norm, attn_k_norm,
                                                                        post_attention_norm, post_ffw_norm

llama.cpp's converter permutes q/k rows for the `llama` architecture only (its LlamaModel, which
also converts MistralForCausalLM: Mistral files say `llama`, without a sliding window). For Gemma 3
it stores every norm's weight plus 1 (`norm_shift`: the loader takes it off again, as transformers'
GGUF reader does) and names the layer's four norms in its own way (`ffn_norm` is the MLP's input
norm, as in Llama, but transformers calls that one pre_feedforward_layernorm there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from pdserve.checkpoint.errors import ModelLoadError, UnsupportedModelError
from pdserve.checkpoint.gemma3_config import gemma3_from_gguf
from pdserve.checkpoint.gguf_dequant import dequantizable, dequantize
from pdserve.checkpoint.gguf_file import GGUFFile, GGUFFormatError, GGUFTensor
from pdserve.checkpoint.model_config import Architecture, ModelConfig
from pdserve.checkpoint.rope_scaling import FreqFactorRopeScaling, LinearRopeScaling, NoRopeScaling, RopeScaling


class GGUFArchitecture(NamedTuple):
    """What one `general.architecture` value is run as, and how its file stores q and k."""

    architecture: Architecture
    interleaved_qk: bool  # q/k rows (and biases) permuted to interleaved rotary pairs
    norm_shift: float = 0.0  # added to every norm's weight in the file
    layer_names: Mapping[str, str] = MappingProxyType({})  # layer tensor names other than _LAYER_NAMES's


_GEMMA3_LAYER_NAMES = MappingProxyType({
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
})
GGUF_ARCHITECTURES = {
    "llama": GGUFArchitecture(Architecture.LLAMA, interleaved_qk=True),
    "qwen2": GGUFArchitecture(Architecture.QWEN2, interleaved_qk=False),
    "qwen3": GGUFArchitecture(Architecture.QWEN3, interleaved_qk=False),
    "gemma3": GGUFArchitecture(Architecture.GEMMA3, interleaved_qk=False, norm_shift=1.0,
                               layer_names=_GEMMA3_LAYER_NAMES),
}
SUPPORTED_ARCHITECTURES = tuple(GGUF_ARCHITECTURES)

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
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}


def open_gguf(path: Path) -> GGUFFile:
    try:
        return GGUFFile(path)
    except GGUFFormatError as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({exc})") from exc


def hf_named_tensors(file: GGUFFile) -> dict[str, GGUFTensor]:
    """The file's tensor entries under transformers' names (its architecture's, where run here)."""
    known = GGUF_ARCHITECTURES.get(file.metadata.get("general.architecture"))
    renamed = known.layer_names if known is not None else {}
    return {hf_name(name, renamed): tensor for name, tensor in file.tensors.items()}


def dequantize_rows(file: GGUFFile, tensor: GGUFTensor, raw: np.ndarray) -> np.ndarray:
    """`raw` (rows of `tensor`, [rows, row_bytes]) -> [rows, row elements] float32."""
    try:
        return dequantize(raw, tensor.kind)
    except NotImplementedError as exc:
        raise UnsupportedModelError(f"{file.path}: tensor {tensor.name} type {tensor.kind.name}: {exc}") from exc


def check_tensor_types(file: GGUFFile) -> None:
    """UnsupportedModelError naming the first tensor of a type nothing here dequantises, and its type."""
    first_of_kind = {}
    for tensor in file.tensors.values():
        first_of_kind.setdefault(tensor.kind, tensor)
    for kind, tensor in first_of_kind.items():
        if not dequantizable(kind):
            raise UnsupportedModelError(f"{file.path}: tensor {tensor.name} type {kind.name} is not supported "
                                        f"(neither this project nor gguf-py dequantises it)")


def gguf_architecture(meta: dict[str, Any]) -> GGUFArchitecture:
    """The file's `general.architecture`; UnsupportedModelError naming it where it is not run here."""
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        supported = ", ".join(SUPPORTED_ARCHITECTURES)
        raise UnsupportedModelError(f"unsupported GGUF architecture {arch!r}; supported: {supported}")
    return GGUF_ARCHITECTURES[arch]


def gguf_config(file: GGUFFile, tensors: dict[str, GGUFTensor], fallback_name: str) -> ModelConfig:
    """The model config from the file's metadata; `tensors` under the transformers names."""
    meta = file.metadata
    layout = gguf_architecture(meta)
    arch = meta["general.architecture"]
    key = _keyed(meta, arch)
    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = _head_dim(meta, arch, hidden // heads, fallback_name)
    config = ModelConfig(
        architecture=layout.architecture,
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
        max_position_embeddings=int(meta.get(f"{arch}.context_length", 4096)),
        tie_word_embeddings="lm_head.weight" not in tensors,
        attention_bias="model.layers.0.self_attn.q_proj.bias" in tensors,
        o_proj_bias="model.layers.0.self_attn.o_proj.bias" in tensors,
        bos_token_id=_optional_int(meta.get("tokenizer.ggml.bos_token_id")),
        eos_token_ids=_eos_ids(meta),
        name=str(meta.get("general.name") or fallback_name),
    )
    if layout.architecture is Architecture.GEMMA3:
        return dataclasses.replace(config, **gemma3_from_gguf(meta, config))
    return config


def _head_dim(meta: dict[str, Any], arch: str, default: int, name: str) -> int:
    """`key_length` (llama.cpp writes it where config.json has head_dim), else hidden / heads."""
    head_dim = int(meta.get(f"{arch}.attention.key_length", default))
    if int(meta.get(f"{arch}.attention.value_length", head_dim)) != head_dim:
        raise UnsupportedModelError(f"{name}: value heads of another width than key heads are not supported")
    if int(meta.get(f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise UnsupportedModelError(f"{name}: partial rotary embedding is not supported")
    return head_dim


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


def hf_name(gguf_name: str, renamed: Mapping[str, str] = MappingProxyType({})) -> str:
    """A GGUF tensor's name under transformers' naming (unknown names unchanged); `renamed`: an
    architecture's own layer tensor names, before the common ones."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if parts[0] == "blk" and len(parts) == 3:
        name = renamed.get(parts[2]) or _LAYER_NAMES.get(parts[2])
        if name is not None:
            return f"model.layers.{parts[1]}.{name}"
    return gguf_name
