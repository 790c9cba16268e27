"""A transformers checkpoint folder: config.json + *.safetensors (one file, or shards with an index).

Reads local files only; never contacts a hub.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from pdserve.checkpoint.errors import ModelLoadError
from pdserve.checkpoint.hf_config import read_hf_config, read_json
from pdserve.checkpoint.model_config import ModelConfig
from pdserve.model.llama import LlamaForCausalLM
from pdserve.model.weights import build_model

INDEX_FILE = "model.safetensors.index.json"


def load_hf_model(folder: Path, device: str | torch.device, dtype: torch.dtype) -> tuple[ModelConfig, LlamaForCausalLM]:
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{folder}: no config.json (expected a transformers checkpoint folder or a .gguf file)")
    config = read_hf_config(folder)
    index = tensor_index(folder)
    with ShardSet(folder) as shards:
        model = build_model(config, lambda name: shards.get(index, name), str(folder), device, dtype)
    return config, model


def tensor_index(folder: Path) -> dict[str, str]:
    """Tensor name -> file name, from the shard index or by listing every safetensors file."""
    if (folder / INDEX_FILE).is_file():
        weight_map = read_json(folder / INDEX_FILE, INDEX_FILE).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{folder / INDEX_FILE}: no weight_map")
        return dict(weight_map)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors weights (other weight formats are not read)")
    index: dict[str, str] = {}
    for file in files:
        with _open(file) as handle:
            index.update(dict.fromkeys(handle.keys(), file.name))
    return index


class ShardSet:
    """Opens each shard once, on first use; closes all on exit (or `close`)."""

    def __init__(self, folder: Path):
        self._folder = folder
        self._open: dict[str, Any] = {}

    def __enter__(self) -> "ShardSet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for handle in self._open.values():
            handle.__exit__(None, None, None)
        self._open.clear()

    def handle(self, file: str) -> Any:
        """The open safetensors file `file` of the folder."""
        if file not in self._open:
            path = self._folder / file
            if not path.is_file():
                raise ModelLoadError(f"{self._folder}: shard {file} listed in the index is missing")
            self._open[file] = _open(path).__enter__()
        return self._open[file]

    def get(self, index: dict[str, str], name: str) -> torch.Tensor:
        file = index[name]
        try:
            return self.handle(file).get_tensor(name)
        except SafetensorError as exc:
            raise ModelLoadError(f"{self._folder / file}: cannot read tensor {name!r}: {exc}") from exc


def _open(path: Path) -> Any:
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as exc:
        raise ModelLoadError(f"{path}: not a readable safetensors file: {exc}") from exc
