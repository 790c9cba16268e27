from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from pdserve.tokenizer import embedded_gguf_path, load_tokenizer  # noqa: E402
from spm_folder import write_spm_folder  # noqa: E402

VARIED_TEXTS = [
    "Hello, world!",
    "The capital of France is Paris.",
    "Crème brûlée, naïve façade, Ångström, São Paulo, Dvořák",
    "日本語のテキストと中文字符，한국어 텍스트",
    "emoji 🎉👍🏽 family 👨\u200d👩\u200d👧 flags 🇫🇷 and ✨",
    "def f(x):\n    return  x   +1\n\n\n\t\tif  y:\n        pass    \n",
    "3.14159 12345 1,000,000 -42 0x1F 2024-06-01",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text with <|endoftext|> inside and <file_sep> too",
    "   leading and trailing spaces   ",
    "line\r\nwindows\rold mac\n",
    "",
    "a",
    "\u00a0non-breaking\u2009thin\u200bzero-width",
    "Ünïcödé 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
]


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
def spm_dir(tmp_path_factory) -> str:
    return write_spm_folder(str(tmp_path_factory.mktemp("spm")))


@pytest.fixture(scope="session")
def spm(spm_dir):
    return load_tokenizer(spm_dir)
