"""Engine test fixtures: each model loaded once a session (ours and transformers'), shared by
every Engine a test builds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.oracle import Oracle

# NOTE: one thread. Measured here (2 cores shared with other test runs): the whole folder took
# 1 min with one thread and 8 min with two; the tiny models' matmuls are too small to share.
torch.set_num_threads(1)

SMOL = "smollm2"
TINY_NAMES = ("llama_gqa_llama3", "qwen2_bias", "llama_untied", "mistral")


@pytest.fixture(scope="session")
def smol_loaded(embedded_gguf_path: Path):
    from pdserve.model.loader import load_model

    return load_model(str(embedded_gguf_path))


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dirs: dict[str, Path]):
    from pdserve.model.loader import load_model

    return {name: load_model(str(path)) for name, path in tiny_model_dirs.items()}


@pytest.fixture(scope="session")
def oracle(tiny_model_dirs: dict[str, Path], embedded_gguf_path: Path) -> Oracle:
    return Oracle({**tiny_model_dirs, SMOL: embedded_gguf_path})


@pytest.fixture(scope="session")
def smol_tokenizer():
    from pdserve.tokenizer import load_tokenizer

    return load_tokenizer(None)


@pytest.fixture(scope="session")
def tiny_tokenizers(tiny_model_dirs: dict[str, Path]):
    from pdserve.tokenizer import load_tokenizer

    return {name: load_tokenizer(str(path)) for name, path in tiny_model_dirs.items()}
