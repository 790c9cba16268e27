"""Where a model is (the embedded GGUF, a .gguf file or a transformers folder), its configuration
without its weights, and the name clients call it by: what the router, the CLI's checks and the
deploy sizing need, without torch."""

from __future__ import annotations

import re
from pathlib import Path

from pdserve.checkpoint.embedded import embedded_model_path
from pdserve.checkpoint.errors import ModelLoadError
from pdserve.checkpoint.gguf_config import gguf_config, hf_named_tensors, open_gguf
from pdserve.checkpoint.hf_config import read_hf_config
from pdserve.checkpoint.model_config import ModelConfig


def resolve_model_path(path: str | None) -> Path:
    """None -> the embedded GGUF; otherwise the path, which must exist."""
    if path is None:
        return embedded_model_path()
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    return resolved


def read_model_config(path: str | None) -> ModelConfig:
    source = resolve_model_path(path)
    if source.is_dir():
        if not (source / "config.json").is_file():
            raise ModelLoadError(f"{source}: no config.json")
        return read_hf_config(source)
    if source.suffix != ".gguf":
        raise ModelLoadError(f"{source}: expected a .gguf file or a folder with config.json and *.safetensors")
    file = open_gguf(source)
    return gguf_config(file, hf_named_tensors(file), fallback_name=source.stem)


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
