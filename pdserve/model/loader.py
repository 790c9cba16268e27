"""One entry point for every model source: a GGUF file, a transformers folder, or the embedded model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from pdserve.checkpoint.errors import ModelLoadError
from pdserve.checkpoint.model_config import ModelConfig
from pdserve.checkpoint.source import resolve_model_path
from pdserve.model.gguf_loader import load_gguf_model
from pdserve.model.hf_loader import load_hf_model
from pdserve.model.llama import LlamaForCausalLM


@dataclass(frozen=True)
class LoadedModel:
    """A model and the checkpoint it was read from; `config` is what `model` computes (a
    tensor-parallel shard's: its rank's share of the heads)."""

    config: ModelConfig
    model: LlamaForCausalLM
    source_path: Path  # the .gguf file or the checkpoint folder


def load_model(path: str | None, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               weights_cache: Path | None = None) -> LoadedModel:
    """Load weights from local files only (no hub). Raises ModelLoadError (UnsupportedModelError
    for readable checkpoints of an architecture this project does not run). `weights_cache`: where
    a GGUF model's assembled weights are kept for the next load to map (weights_cache.py)."""
    source = resolve_model_path(path)
    if source.is_dir():
        config, model = load_hf_model(source, device, dtype)
    elif source.suffix == ".gguf":
        config, model = load_gguf_model(source, device, dtype, weights_cache)
    else:
        raise ModelLoadError(f"{source}: expected a .gguf file or a folder with config.json and *.safetensors")
    return LoadedModel(config, model, source)
