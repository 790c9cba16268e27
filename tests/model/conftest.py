from __future__ import annotations

import pytest
import torch

from tests.model.smol_prompts import SMOL_NEW_TOKENS, SMOL_PROMPTS


@pytest.fixture(scope="session")
def smollm2(embedded_gguf_path):
    from pdserve.model import load_model

    return load_model(str(embedded_gguf_path))


@pytest.fixture(scope="session")
def smollm2_reference_ids(embedded_gguf_path) -> dict[str, list[int]]:
    """transformers' greedy continuation of every SMOL_PROMPTS entry, computed once a session."""
    from tests.helpers.hf_models import load_hf_model
    from tests.helpers.reference import hf_greedy

    model = load_hf_model(embedded_gguf_path)
    references = {name: hf_greedy(model, ids, SMOL_NEW_TOKENS) for name, ids in SMOL_PROMPTS.items()}
    del model
    return references


@pytest.fixture(scope="session")
def tiny_models(tiny_model_dirs):
    """Name -> (our LoadedModel, transformers' model) for every tiny checkpoint."""
    from transformers import AutoModelForCausalLM

    from pdserve.model import load_model

    return {
        name: (load_model(str(path)), AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval())
        for name, path in tiny_model_dirs.items()
    }
