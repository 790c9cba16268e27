from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dirs):
    """Name -> our LoadedModel of every tiny checkpoint (the CPU paths are compared to the model's
    own reference, not to transformers)."""
    from pdserve.model import load_model

    return {name: load_model(str(path)) for name, path in tiny_model_dirs.items()}
