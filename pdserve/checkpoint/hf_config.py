"""A transformers checkpoint's config.json (and generation_config.json's end-of-sequence ids)
-> ModelConfig, in pure Python. Both the old `rope_scaling` and the new `rope_parameters` forms
(per kind of layer where a model has two: the global layers' here, Gemma 3's others in
gemma3_config.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from pdserve.checkpoint.errors import ModelLoadError, UnsupportedModelError
from pdserve.checkpoint.gemma3_config import gemma3_from_hf
from pdserve.checkpoint.model_config import Architecture, ModelConfig
from pdserve.checkpoint.rope_scaling import Llama3RopeScaling, LinearRopeScaling, NoRopeScaling, RopeScaling


def read_hf_config(folder: Path) -> ModelConfig:
    raw = read_json(folder / "config.json", "config.json")
    generation = folder / "generation_config.json"
    extra_eos = ()
    if generation.is_file():
        eos = read_json(generation, "generation_config.json").get("eos_token_id")
        extra_eos = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return config_from_hf(raw, name=folder.name, extra_eos=tuple(int(e) for e in extra_eos))


def config_from_hf(raw: dict[str, Any], name: str, extra_eos: tuple[int, ...] = ()) -> ModelConfig:
    """Parse a transformers config.json (old `rope_scaling` and new `rope_parameters` forms)."""
    arch = _architecture(raw)
    heads = _need(raw, "num_attention_heads", name)
    hidden = _need(raw, "hidden_size", name)
    if raw.get("mlp_bias"):
        raise UnsupportedModelError(f"{name}: mlp_bias=true is not supported")
    llama_bias = bool(raw.get("attention_bias", False)) and arch is not Architecture.QWEN2
    window = _sliding_window(raw, arch)
    max_pos = int(raw.get("max_position_embeddings", 4096))
    theta, scaling = _hf_rope(raw, name)
    config = ModelConfig(
        architecture=arch,
        vocab_size=_need(raw, "vocab_size", name),
        hidden_size=hidden,
        intermediate_size=_need(raw, "intermediate_size", name),
        num_layers=_need(raw, "num_hidden_layers", name),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=min(max_pos, window) if window else max_pos,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=arch is Architecture.QWEN2 or llama_bias,
        o_proj_bias=llama_bias,
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_merge_ids(_as_ids(raw.get("eos_token_id")), extra_eos),
        name=name,
        sliding_window=window,
    )
    if arch is Architecture.GEMMA3:
        return dataclasses.replace(config, **gemma3_from_hf(raw, config))
    return config


def _architecture(raw: dict[str, Any]) -> Architecture:
    names = raw.get("architectures") or []
    for candidate in names:
        try:
            return Architecture(candidate)
        except ValueError:
            continue
    shown = ", ".join(names) if names else f"model_type={raw.get('model_type')!r}"
    supported = ", ".join(a.value for a in Architecture)
    raise UnsupportedModelError(f"unsupported architecture {shown}; supported: {supported}")


def _need(raw: dict[str, Any], key: str, name: str) -> int:
    if key not in raw:
        raise ModelLoadError(f"{name}: config.json lacks {key!r}")
    return int(raw[key])


def _sliding_window(raw: dict[str, Any], arch: Architecture) -> int | None:
    window = raw.get("sliding_window")
    enabled = arch is Architecture.MISTRAL or bool(raw.get("use_sliding_window"))
    return int(window) if window and enabled else None


def _hf_rope(raw: dict[str, Any], name: str) -> tuple[float, RopeScaling]:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    params = params.get("full_attention") or params  # keyed by kind of layer: the global layers'
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, NoRopeScaling()
    if kind == "linear":
        return theta, LinearRopeScaling(float(params["factor"]))
    if kind == "llama3":
        scaling = Llama3RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
        return theta, scaling
    raise UnsupportedModelError(f"{name}: rope scaling {kind!r} is not supported (default, linear, llama3 are)")


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def _merge_ids(first: tuple[int, ...], second: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(first + second))


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot read {what}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: {what} is not a JSON object")
    return data
