"""Worker tests: one tiny Llama loaded once, shared by every engine a test builds."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    from pdserve.model.loader import load_model
    from tests.helpers.tiny_models import tiny_llama_gqa_llama3

    return load_model(str(tiny_llama_gqa_llama3(tmp_path_factory.mktemp("tiny") / "llama")))
