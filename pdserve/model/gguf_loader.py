"""A llama.cpp GGUF file's tensors dequantized to float as the model's weights (the file read by
pdserve/checkpoint/gguf_file.py, its config by gguf_config.py, the bytes dequantised by
gguf_dequant.py: gguf-py only for types those lack).

GGUF stores the Llama q/k projections (architecture `llama`, Mistral's too; not `qwen2` or `qwen3`)
with their rows permuted for an interleaved (GPT-J) rotary layout; this project rotates halves
(rotate-half), so the permutation is undone on load:

    rows of one head, GGUF:        [x0 y0 x1 y1 ... ]   pairs interleaved
    rows of one head, rotate-half: [x0 x1 ... y0 y1 ...]

Gemma 3 files hold every norm's weight plus 1; the 1 is taken off on load (in float32, as
transformers' GGUF reader does), so the model holds the weights as trained.

On a CPU with a cache folder, the assembled weights are kept there and later loads map them
(weights_cache.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from pdserve.checkpoint.gguf_config import (GGUFArchitecture, check_tensor_types, dequantize_rows, gguf_architecture,
                                            gguf_config, hf_named_tensors, open_gguf)
from pdserve.checkpoint.gguf_file import GGUFFile, GGUFTensor
from pdserve.checkpoint.model_config import ModelConfig
from pdserve.model.llama import LlamaForCausalLM
from pdserve.model.weights import assemble_state, model_from_state
from pdserve.model.weights_cache import kept_weights


class GGUFCheckpoint(NamedTuple):
    """An opened GGUF file, its tensor entries under the transformers names, its config and how
    its architecture stores q and k."""

    file: GGUFFile
    tensors: dict[str, GGUFTensor]
    config: ModelConfig
    layout: GGUFArchitecture

    def read(self, name: str, raw: np.ndarray | None = None) -> torch.Tensor:
        """Tensor `name` dequantised to float32 in the transformers shape, q/k rows in
        rotate-half order, norms without the file's shift; `raw`: some of its rows ([rows,
        row_bytes], default all of them). Raises UnsupportedModelError for a type neither this
        project nor gguf-py dequantises."""
        tensor = self.tensors[name]
        values = dequantize_tensor(self.file, tensor, self.file.raw(tensor) if raw is None else raw)
        if raw is None:
            values = values.reshape(tensor.shape)
        if self.layout.interleaved_qk and name.split(".")[-2] in ("q_proj", "k_proj"):
            return unpermute_rows(values, values.shape[0] // self.config.head_dim)
        if self.layout.norm_shift and name.endswith("norm.weight"):
            return values - self.layout.norm_shift
        return values


def load_gguf_model(path: Path, device: str | torch.device, dtype: torch.dtype,
                    cache: Path | None = None) -> tuple[ModelConfig, LlamaForCausalLM]:
    """`cache`: the folder the assembled weights are kept in and mapped from (CPU only; None: not kept)."""
    checkpoint = open_gguf_checkpoint(path)

    def assemble() -> dict[str, torch.Tensor]:
        return assemble_state(checkpoint.config, checkpoint.read, str(path), device, dtype)

    kept = cache is not None and torch.device(device).type == "cpu"
    state = kept_weights(path, dtype, assemble, cache) if kept else assemble()
    return checkpoint.config, model_from_state(checkpoint.config, state, str(path), device)


def open_gguf_checkpoint(path: Path) -> GGUFCheckpoint:
    """Raises ModelLoadError (a damaged file), UnsupportedModelError (an architecture not run here,
    a tensor of a type nothing here dequantises)."""
    file = open_gguf(path)
    tensors = hf_named_tensors(file)
    config = gguf_config(file, tensors, fallback_name=path.stem)
    check_tensor_types(file)
    return GGUFCheckpoint(file, tensors, config, gguf_architecture(file.metadata))


def dequantize_tensor(file: GGUFFile, tensor: GGUFTensor, raw: np.ndarray) -> torch.Tensor:
    """`raw` (rows of `tensor`, [rows, row_bytes]) -> [rows, row elements] float32."""
    return torch.from_numpy(dequantize_rows(file, tensor, raw))


def unpermute_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[rows, cols] in GGUF's interleaved pair order -> rotate-half order, per head."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, -1).transpose(1, 2).reshape(weight.shape)
