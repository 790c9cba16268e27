"""Tokenizer fixtures: the embedded SmolLM2 (ours, transformers' and saved as an HF folder), a
SentencePiece-style folder and the tiny test checkpoints' tokenizer."""

import os

import pytest

from pdserve.tokenizer import embedded_gguf_path, load_tokenizer
from tests.tokenizer.spm_folder import write_spm_folder


@pytest.fixture(scope="session")
def gguf_path() -> str:
    return embedded_gguf_path()


@pytest.fixture(scope="session")
def smol(gguf_path):
    return load_tokenizer(gguf_path)


@pytest.fixture(scope="session")
def smol_reference(gguf_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))


@pytest.fixture(scope="session")
def smol_dir(smol_reference, tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("smol_hf"))
    smol_reference.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> str:
    from tests.helpers.tiny_models import build_tokenizer

    folder = tmp_path_factory.mktemp("tiny")
    build_tokenizer(folder)
    return str(folder)


@pytest.fixture(scope="session")
def spm_dir(tmp_path_factory) -> str:
    return write_spm_folder(str(tmp_path_factory.mktemp("spm")))


@pytest.fixture(scope="session")
def spm(spm_dir):
    return load_tokenizer(spm_dir)
