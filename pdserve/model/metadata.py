"""A model's configuration without its weights (the router needs limits, not tensors)."""

from __future__ import annotations

import re

from pdserve.model.config import ModelConfig
from pdserve.model.errors import ModelLoadError
from pdserve.model.gguf_loader import open_gguf_checkpoint
from pdserve.model.hf_loader import read_hf_config
from pdserve.model.loader import resolve_model_path


def read_model_config(path: str | None) -> ModelConfig:
    source = resolve_model_path(path)
    if source.is_dir():
        if not (source / "config.json").is_file():
            raise ModelLoadError(f"{source}: no config.json")
        return read_hf_config(source)
    if source.suffix != ".gguf":
        raise ModelLoadError(f"{source}: expected a .gguf file or a folder with config.json and *.safetensors")
    return open_gguf_checkpoint(source).config


def served_name(path: str | None) -> str:
    """The name clients use for the model (OpenAI's `model`): its folder's name, or its file's
    without the extension and a quantisation suffix ("SmolLM2-135M-Instruct.Q4_1.gguf" ->
    "SmolLM2-135M-Instruct")."""
    source = resolve_model_path(path)
    if source.is_dir():
        return source.name
    stem = source.stem
    head, dot, tail = stem.rpartition(".")
    return head if dot and re.fullmatch(r"(?i)(q\d.*|f16|f32|bf16|iq\d.*)", tail) else stem
