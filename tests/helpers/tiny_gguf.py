"""A tiny transformers checkpoint (tiny_models.py) written as a GGUF file the way llama.cpp's
convert_hf_to_gguf.py writes it, with gguf-py's own GGUFWriter and tensor name map:

    config.json                    GGUF
    Llama, Mistral                 general.architecture "llama", q/k rows (and biases) permuted
                                   to interleaved rotary pairs (LlamaModel.permute)
    Qwen2, Qwen3                   "qwen2", "qwen3": tensors as transformers holds them
    Gemma 3                        "gemma3": every norm's weight plus 1 (Gemma3Model.norm_shift),
                                   the window as attention.sliding_window, linear scaling of the
                                   global layers' rope where configured; a config llama.cpp would
                                   not read back (another layer pattern, local rope base or
                                   query_pre_attn_scalar than head_dim) is refused. Its vocabulary
                                   is the tiny byte-level one (llama.cpp would write SentencePiece)
    head_dim (where given)         <arch>.attention.key_length and value_length
    tokenizer.json (byte-level)    tokenizer.ggml.model "gpt2", pre "gpt-2" (the GPT-2 split the
                                   tiny tokenizer's ByteLevel pre-tokenizer runs), tokens, merges

Matrices are stored as `kind` (F32, F16, F64 or a type gguf-py quantises: Q8_0, Q4_0, ...); vectors
(norms, biases) as F32, as llama.cpp stores them. `dequantized_state` is the checkpoint's tensors
as such a file holds them once gguf-py dequantises them: what transformers is fed to be the
reference for a quantised file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

GGUF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                      "Qwen3ForCausalLM": "qwen3", "Gemma3ForCausalLM": "gemma3"}


def write_gguf(folder: Path, path: Path, kind: str = "F32") -> Path:
    """The checkpoint in `folder` written to `path` with its matrices stored as `kind` (a
    GGMLQuantizationType name)."""
    import gguf

    config = _config(folder)
    arch = GGUF_ARCHITECTURES[config["architectures"][0]]
    writer = gguf.GGUFWriter(str(path), arch)
    _hyperparameters(writer, config, folder.name)
    _vocabulary(writer, folder)
    names = gguf.get_tensor_name_map(_model_arch(arch), config["num_hidden_layers"])
    for name, array in _stored_tensors(folder, config, arch).items():
        _add_tensor(writer, names.get_name(name, try_suffixes=(".weight", ".bias")), array, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def dequantized_state(folder: Path, kind: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors (transformers names and layout) as a `kind` file stores them,
    dequantised by gguf-py (row permutation and row-wise blocks commute)."""
    return {name: torch.from_numpy(_round_trip(array, kind)) for name, array in _tensors(folder).items()}


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _model_arch(arch: str):
    import gguf

    return next(key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)


def _hyperparameters(writer, config: dict, name: str) -> None:
    rope = config.get("rope_parameters") or {}
    if writer.arch == "gemma3":
        rope = _gemma3_hyperparameters(writer, config, name)
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"{name}: this helper writes default rotary scaling only")
    writer.add_name(name)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if config.get("head_dim") is not None:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if writer.arch == "llama":
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def _gemma3_hyperparameters(writer, config: dict, name: str) -> dict:
    """What llama.cpp's Gemma3Model writes beyond the common keys; returns the global layers'
    rope parameters left to write (linear scaling written here)."""
    import gguf

    layers, pattern = config["num_hidden_layers"], 6
    kinds = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
    rope = config.get("rope_parameters") or {}
    local = rope.get("sliding_attention") or {}
    if config.get("layer_types", kinds) != kinds or config["query_pre_attn_scalar"] != config["head_dim"]:
        raise ValueError(f"{name}: llama.cpp reads every 6th layer global and scores scaled by 1/sqrt(head_dim)")
    if local.get("rope_type", "default") != "default" or local.get("rope_theta", 10000.0) != 10000.0:
        raise ValueError(f"{name}: llama.cpp reads the local layers' rope as base 10000, unscaled")
    writer.add_sliding_window(config["sliding_window"])
    full = dict(rope.get("full_attention") or {})
    if full.get("rope_type", "default") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full.pop("factor"))
        full["rope_type"] = "default"
    return full


def _vocabulary(writer, folder: Path) -> None:
    """The byte-level BPE of tokenizer.json as llama.cpp's `gpt2` vocabulary."""
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    vocab = {**tokenizer["model"]["vocab"], **{t["content"]: t["id"] for t in tokenizer["added_tokens"]}}
    tokens = sorted(vocab, key=vocab.get)
    special = {t["content"] for t in tokenizer["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    config = _config(folder)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in special else 1 for token in tokens])  # CONTROL, NORMAL
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(_chat_template(folder))


def _chat_template(folder: Path) -> str:
    """transformers 5 saves it as chat_template.jinja, earlier versions in tokenizer_config.json."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    return json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]


def _tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.torch import load_file

    return {name: tensor.float().numpy() for name, tensor in load_file(folder / "model.safetensors").items()}


def _stored_tensors(folder: Path, config: dict, arch: str) -> dict[str, np.ndarray]:
    """transformers' tensors, q/k permuted where llama.cpp's converter permutes them, Gemma 3's
    norms shifted by 1 as it shifts them."""
    tensors = _tensors(folder)
    if arch == "gemma3":
        return {name: array + 1 if name.endswith("norm.weight") else array for name, array in tensors.items()
                if name != "lm_head.weight"}
    if arch != "llama":
        return tensors
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    for name, array in tensors.items():
        module = name.split(".")[-2]
        if module in heads:
            tensors[name] = _interleave(array, heads[module])
    return tensors


def _interleave(array: np.ndarray, heads: int) -> np.ndarray:
    """Rows of each head from rotate-half order to interleaved pairs (llama.cpp's permute)."""
    shape = array.shape
    return np.ascontiguousarray(array.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2)
                                .reshape(shape))


_FLOATS = {"F32": np.float32, "F16": np.float16, "F64": np.float64}  # stored as numpy writes them


def _add_tensor(writer, name: str, array: np.ndarray, kind: str) -> None:
    import gguf

    kind = kind if array.ndim == 2 else "F32"
    if kind in _FLOATS:
        writer.add_tensor(name, array.astype(_FLOATS[kind]))
        return
    qtype = gguf.GGMLQuantizationType[kind]
    writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)  # [rows, row bytes]


def _round_trip(array: np.ndarray, kind: str) -> np.ndarray:
    import gguf

    kind = kind if array.ndim == 2 else "F32"
    if kind in _FLOATS:
        return array.astype(_FLOATS[kind]).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    return gguf.quants.dequantize(gguf.quants.quantize(array, qtype), qtype).reshape(array.shape)
