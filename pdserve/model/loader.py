"""One entry point for every model source: a GGUF file, a transformers folder, or the embedded model."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pdserve.attention.native_build import cache_dir
from pdserve.checkpoint.errors import ModelLoadError
from pdserve.checkpoint.model_config import ModelConfig
from pdserve.checkpoint.source import resolve_model_path
from pdserve.model.dtypes import serving_dtype
from pdserve.model.gguf_loader import load_gguf_model
from pdserve.model.hf_loader import load_hf_model
from pdserve.model.llama import LlamaForCausalLM
from pdserve.model.layer_kernels import apply_layer_kernels
from pdserve.model.fused_decode import fuse_decode
from pdserve.model.weight_layout import WeightLayout, apply_weight_layout
from pdserve.parallel.ranks import Alone, RankGroup

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pdserve.config import EngineConfig
    from pdserve.parallel.communicator import Communicator


@dataclass(frozen=True)
class LoadedModel:
    """`config` is what this process's model computes: with tensor parallelism, its rank's share
    of the heads (the KV pool is built from it); `ranks` the worker's other ranks."""

    config: ModelConfig
    model: LlamaForCausalLM
    source_path: Path  # the .gguf file or the checkpoint folder
    ranks: RankGroup = field(default_factory=Alone)
    layout: WeightLayout = WeightLayout("dense")  # how the projections multiply (load_engine_model chose)


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


def load_model_shard(path: str | None, device: str | torch.device, dtype: torch.dtype,
                     comm: "Communicator") -> LoadedModel:
    """Rank `comm.rank`'s tensor-parallel shard, read from the checkpoint a slice at a time
    (pdserve/parallel/shard_load.py): the rank reads its share of every split tensor, not the
    whole model, and the device holds the shard only."""
    from pdserve.parallel.shard_load import load_shard

    source = resolve_model_path(path)
    model = load_shard(source, device, dtype, comm)
    return LoadedModel(model.config, model, source)


def load_engine_model(config: "EngineConfig") -> LoadedModel:
    """The model an engine runs: the whole model with its projections laid out as
    `config.weight_layout` asks, its small ops on `config.layer_kernels` and its decode steps fused
    where both chose native kernels (pdserve/model/fused_decode.py), or at
    tensor_parallel_size > 1 rank 0's shard with the follower ranks started (LoadedModel.ranks;
    close them with `ranks.close()`; shards multiply dense, with the torch kernels)."""
    if config.tensor_parallel_size == 1:
        dtype = serving_dtype(config.dtype, config.device)
        loaded = load_model(config.model, device=config.device, dtype=dtype, weights_cache=cache_dir())
        log.info("read %s: %d layers, %s", loaded.source_path.name, loaded.config.num_layers, dtype)
        layout = apply_weight_layout(loaded.model, config.weight_layout, config.device, dtype)
        apply_layer_kernels(loaded.model, config.layer_kernels, config.device, dtype)
        fuse_decode(loaded.model)  # where both of the above chose their native kernels
        return dataclasses.replace(loaded, layout=layout)
    from pdserve.parallel.leader import start_leader

    return start_leader(config)
