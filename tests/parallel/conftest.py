"""Tensor-parallel test fixtures: engines whose follower ranks are real processes (gloo, one
torch thread each), and transformers as the oracle (tests/engine/oracle.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pdserve.config import CacheConfig, EngineConfig, PreemptionConfig, SchedulerConfig
from tests.engine.oracle import Oracle

torch.set_num_threads(1)  # followers take rank 0's thread count
SMOL = "smollm2"


@pytest.fixture(scope="session")
def oracle(tiny_model_dirs: dict[str, Path], embedded_gguf_path: Path) -> Oracle:
    return Oracle({**tiny_model_dirs, SMOL: embedded_gguf_path})


def tp_config(model: Path | None, tp: int, *, block_size: int = 4, num_blocks: int = 128, num_host_blocks: int = 0,
              max_chunk_tokens: int = 16, preemption: PreemptionConfig = PreemptionConfig()) -> EngineConfig:
    """A small engine on the CPU (float32, torch attention) at tensor parallel size `tp`."""
    cache = CacheConfig(block_size=block_size, num_blocks=num_blocks, num_host_blocks=num_host_blocks)
    scheduler = SchedulerConfig(token_budget=64, max_chunk_tokens=max_chunk_tokens, aging_seconds=None,
                                preemption=preemption)
    return EngineConfig(model=None if model is None else str(model), dtype="float32", attention_backend="torch",
                        tensor_parallel_size=tp, cache=cache, scheduler=scheduler)


@pytest.fixture(scope="session")
def smol_tokenizer():
    from pdserve.tokenizer import load_tokenizer

    return load_tokenizer(None)
