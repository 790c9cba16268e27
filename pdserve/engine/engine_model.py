"""The model an engine runs, and its loading: the one place that joins the model (pdserve/model/),
its CPU paths and tensor parallelism (pdserve/parallel/), so neither of those imports the other's
loader.

    1 rank:   the whole model (load_model), its projections laid out as `weight_layout` asks, its
              small ops on `layer_kernels`, its decode steps fused where both chose native kernels
    n ranks:  rank 0's shard behind a LeaderModel, the follower ranks started (parallel/leader.py);
              shards multiply dense, with the torch kernels
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from pdserve.checkpoint.model_config import ModelConfig
from pdserve.config import EngineConfig
from pdserve.cpu.transform import apply_cpu_paths
from pdserve.cpu.weight_layout import WeightLayout
from pdserve.model.dtypes import serving_dtype
from pdserve.model.loader import LoadedModel, load_model
from pdserve.native.build import cache_dir
from pdserve.parallel.ranks import Alone, RankGroup
from pdserve.start_phases import StartPhases

if TYPE_CHECKING:
    from pdserve.parallel.leader import RankZero

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineModel:
    """`config` is what this process's model computes: with tensor parallelism, its rank's share
    of the heads (the KV pool is built from it); `ranks` the worker's other ranks (close them with
    `ranks.close()`); `layout` how the projections multiply."""

    config: ModelConfig
    model: nn.Module
    source_path: Path  # the .gguf file or the checkpoint folder
    ranks: RankGroup = field(default_factory=Alone)
    layout: WeightLayout = WeightLayout("dense")

    @classmethod
    def alone(cls, loaded: LoadedModel) -> EngineModel:
        """A model loaded by the caller, run as it is, on one rank."""
        return cls(loaded.config, loaded.model, loaded.source_path)

    @classmethod
    def leading(cls, rank_zero: RankZero) -> EngineModel:
        """Rank 0 of a tensor-parallel worker, its followers started (parallel/leader.py)."""
        loaded = rank_zero.loaded
        return cls(loaded.config, loaded.model, loaded.source_path, ranks=rank_zero.followers)


def load_engine_model(config: EngineConfig, phases: StartPhases | None = None) -> EngineModel:
    """The model an engine of `config` runs (see the module's docstring), its phases logged in
    `phases`. Raises ModelLoadError, and with tensor parallelism TensorParallelError and RankFailed."""
    phases = phases if phases is not None else StartPhases()
    if config.tensor_parallel_size > 1 and config.deterministic:
        raise ValueError("--deterministic runs on one rank (a tensor-parallel all-reduce sums in no fixed order)")
    if config.tensor_parallel_size > 1:
        from pdserve.parallel.leader import start_leader

        leading = EngineModel.leading(start_leader(config))
        phases.done("model and ranks")
        return leading
    dtype = serving_dtype(config.dtype, config.device)
    loaded = load_model(config.model, device=config.device, dtype=dtype, weights_cache=cache_dir())
    log.info("read %s: %d layers, %s", loaded.source_path.name, loaded.config.num_layers, dtype)
    phases.done("model read")
    layout = apply_cpu_paths(loaded.model, config.weight_layout, config.layer_kernels, config.device, dtype,
                             config.deterministic)
    phases.done("cpu paths")
    return EngineModel(loaded.config, loaded.model, loaded.source_path, layout=layout)

