"""One entry point for every model source: a GGUF file, a transformers folder, or the embedded model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from pdserve.model.config import ModelConfig
from pdserve.model.embedded import embedded_model_path
from pdserve.model.errors import ModelLoadError
from pdserve.model.gguf_loader import load_gguf_model
from pdserve.model.hf_loader import load_hf_model
from pdserve.model.llama import LlamaForCausalLM


@dataclass(frozen=True)
class LoadedModel:
    config: ModelConfig
    model: LlamaForCausalLM
    source_path: Path  # the .gguf file or the checkpoint folder


def resolve_model_path(path: str | None) -> Path:
    """None -> the embedded GGUF; otherwise the path, which must exist."""
    if path is None:
        return embedded_model_path()
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    return resolved


def load_model(path: str | None, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load weights from local files only (no hub). Raises ModelLoadError (UnsupportedModelError
    for readable checkpoints of an architecture this project does not run)."""
    source = resolve_model_path(path)
    if source.is_dir():
        config, model = load_hf_model(source, device, dtype)
    elif source.suffix == ".gguf":
        config, model = load_gguf_model(source, device, dtype)
    else:
        raise ModelLoadError(f"{source}: expected a .gguf file or a folder with config.json and *.safetensors")
    return LoadedModel(config, model, source)
