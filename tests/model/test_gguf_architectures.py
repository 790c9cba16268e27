"""GGUF files of every architecture run here (llama, Mistral written as llama, qwen2, qwen3; gemma3:
test_gemma3.py), written from the tiny checkpoints as llama.cpp's converter writes them
(tests/helpers/tiny_gguf.py): the config read from the file is the folder's, greedy decoding
equals transformers' on the checkpoint the file came from, token for token, and a quantised file
equals transformers fed the same dequantised weights. Architectures and tensor types nothing here
runs are refused at load, by name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from pdserve.checkpoint.errors import UnsupportedModelError
from pdserve.checkpoint.model_config import Architecture
from pdserve.model import load_model
from tests.helpers.paged_driver import PagedDriver
from tests.helpers.reference import hf_greedy
from tests.helpers.tiny_gguf import dequantized_state, write_gguf
from tests.helpers.tiny_models import _CORPUS
from tests.model.test_model_parity import TINY_NEW_TOKENS, TINY_RUNS, tiny_prompt

pytestmark = pytest.mark.timeout(600)

GGUF_NAMES = ("llama_untied", "mistral", "qwen2_bias", "qwen3")
QUANTISED = (("mistral", "Q8_0"), ("qwen3", "Q8_0"), ("qwen2_bias", "Q4_0"))


@pytest.fixture(scope="module")
def gguf_files(tiny_model_dirs, tmp_path_factory) -> dict[str, Path]:
    """Name -> the tiny checkpoint as an F32 GGUF file."""
    root = tmp_path_factory.mktemp("tiny_gguf")
    return {name: write_gguf(tiny_model_dirs[name], root / f"{name}.gguf") for name in GGUF_NAMES}


@pytest.fixture(scope="module")
def gguf_models(gguf_files):
    return {name: load_model(str(path)) for name, path in gguf_files.items()}


def greedy_runs(model, reference) -> None:
    """Greedy ids of TINY_RUNS' prompts, whole and chunked, equal transformers'."""
    for length, chunks in TINY_RUNS.items():
        prompt = tiny_prompt(length, model.config.vocab_size, seed=length)
        expected = hf_greedy(reference, prompt, TINY_NEW_TOKENS)
        for chunk in chunks:
            driver = PagedDriver(model, block_size=4, shuffle_seed=length)
            assert driver.greedy(prompt, TINY_NEW_TOKENS, chunk=chunk) == expected, f"{length}, chunk {chunk}"


@pytest.mark.parametrize("name", GGUF_NAMES)
def test_the_files_config_is_the_folders(gguf_models, tiny_models, name):
    folder, file = tiny_models[name][0].config, gguf_models[name].config
    architecture = Architecture.LLAMA if name == "mistral" else folder.architecture
    # llama.cpp writes no sliding window for Mistral: the file's context is its full one; GGUF
    # holds the norm's epsilon as a float32
    expected = dataclasses.replace(folder, architecture=architecture, name=name, sliding_window=None,
                                   max_position_embeddings=tiny_models[name][1].config.max_position_embeddings,
                                   rms_norm_eps=file.rms_norm_eps)
    assert file == expected and file.rms_norm_eps == pytest.approx(folder.rms_norm_eps, rel=1e-7)


@pytest.mark.parametrize("name", GGUF_NAMES)
def test_greedy_equals_transformers_on_the_checkpoint_the_file_came_from(gguf_models, tiny_models, name):
    greedy_runs(gguf_models[name].model, tiny_models[name][1])


@pytest.mark.parametrize(("name", "kind"), QUANTISED)
def test_a_quantised_file_equals_transformers_fed_its_dequantised_weights(tiny_model_dirs, tmp_path, name, kind):
    from transformers import AutoModelForCausalLM

    folder = tiny_model_dirs[name]
    reference = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    assert not reference.load_state_dict(dequantized_state(folder, kind), strict=False).unexpected_keys
    loaded = load_model(str(write_gguf(folder, tmp_path / f"{name}.{kind}.gguf", kind)))
    greedy_runs(loaded.model, reference)


@pytest.mark.parametrize("name", ["llama_untied", "qwen2_bias"])
def test_transformers_reads_the_written_files_as_the_checkpoint(tiny_models, gguf_files, name):
    """The helper writes llama.cpp's layout (q/k permuted for llama only): transformers' own GGUF
    reader, which undoes llama.cpp's permutation, gets the checkpoint's tensors back. (It cannot
    read the other two: a Mistral file by name, a Qwen3 head_dim other than 128.)"""
    from transformers import AutoModelForCausalLM

    path = gguf_files[name]
    read = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    expected = tiny_models[name][1].state_dict()
    assert read.state_dict().keys() == expected.keys()
    assert all(torch.equal(read.state_dict()[key], value) for key, value in expected.items())


def test_the_files_vocabulary_and_chat_template_are_the_folders(tiny_model_dirs, gguf_files):
    from pdserve.tokenizer import ChatMessage, load_tokenizer

    ours, folder = load_tokenizer(str(gguf_files["qwen3"])), load_tokenizer(str(tiny_model_dirs["qwen3"]))
    for text in [*_CORPUS, "<|im_start|>user\nHi there!<|im_end|>\n"]:
        assert ours.encode(text) == folder.encode(text), text
    chat = [ChatMessage("user", "What is the capital of France?")]
    assert ours.apply_chat_template(chat) == folder.apply_chat_template(chat)


@pytest.mark.parametrize("arch", ["qwen2moe", "qwen3moe", "gemma2", "phi3"])  # gpt2: test_model_loading.py
def test_an_architecture_not_run_here_is_refused_by_name(tmp_path, arch):
    import gguf
    import numpy as np

    path = tmp_path / f"{arch}.gguf"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match=f"unsupported GGUF architecture '{arch}'; supported: llama, "):
        load_model(str(path))


def test_a_tensor_type_nothing_dequantises_is_refused_at_load_by_name(tiny_model_dirs, tmp_path):
    path = write_gguf(tiny_model_dirs["qwen3"], tmp_path / "f64.gguf", "F64")
    with pytest.raises(UnsupportedModelError, match=r"tensor output\.weight type F64 is not supported"):
        load_model(str(path))
