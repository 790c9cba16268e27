"""Loading from every source, and the errors for paths that do not hold a usable model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from pdserve.checkpoint.errors import ModelLoadError, UnsupportedModelError
from pdserve.model import load_model
from tests.helpers.paged_driver import PagedDriver
from tests.helpers.reference import hf_last_logits
from tests.helpers.tiny_gguf import write_gguf

PROMPT = [1, 17, 200, 45, 99, 310, 7, 64, 128, 5, 250, 33]


def copy_model(tiny_model_dirs, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_model_dirs[name], tmp_path / name))


def last_logits(loaded, prompt=PROMPT) -> torch.Tensor:
    driver = PagedDriver(loaded.model, block_size=4)
    return driver.step([(driver.new_sequence(prompt), len(prompt))])[0]


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_embedded_model_is_the_default(embedded_gguf_path, smollm2):
    assert smollm2.source_path == embedded_gguf_path
    assert smollm2.config.num_layers == 30 and smollm2.model.embed_tokens is None


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nowhere"))


def test_file_that_is_neither_gguf_nor_folder(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 64)
    with pytest.raises(ModelLoadError, match=r"expected a \.gguf file or a folder"):
        load_model(str(tmp_path / "weights.bin"))


def test_corrupt_gguf(tmp_path):
    path = tmp_path / "noise.gguf"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        load_model(str(path))


def test_truncated_gguf(tmp_path, embedded_gguf_path):
    path = tmp_path / "cut.gguf"
    with open(embedded_gguf_path, "rb") as source:
        path.write_bytes(source.read(3_000_000))
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        load_model(str(path))


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))


def test_folder_without_weights(tiny_model_dirs, tmp_path):
    folder = copy_model(tiny_model_dirs, "llama_untied", tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors weights"):
        load_model(str(folder))


def test_unsupported_architecture(tiny_model_dirs, tmp_path):
    folder = copy_model(tiny_model_dirs, "llama_untied", tmp_path)
    edit_config(folder, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        load_model(str(folder))


def test_missing_tensor(tiny_model_dirs, tmp_path):
    folder = copy_model(tiny_model_dirs, "llama_untied", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match="missing tensor 'model.layers.1.mlp.up_proj.weight'"):
        load_model(str(folder))


def test_shape_mismatch(tiny_model_dirs, tmp_path):
    folder = copy_model(tiny_model_dirs, "llama_untied", tmp_path)
    edit_config(folder, intermediate_size=96)
    message = r"'model.layers.0.mlp.gate_proj.weight' has shape \(128, 64\), the config implies \(96, 64\)"
    with pytest.raises(ModelLoadError, match=message):
        load_model(str(folder))


def test_truncated_safetensors(tiny_model_dirs, tmp_path):
    folder = copy_model(tiny_model_dirs, "llama_untied", tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="not a readable safetensors file"):
        load_model(str(folder))


def test_sharded_checkpoint_loads_like_a_single_file(tiny_model_dirs, tiny_models, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(tiny_model_dirs["qwen2_bias"]).save_pretrained(folder, max_shard_size="100KB")
    assert (folder / "model.safetensors.index.json").is_file() and len(list(folder.glob("*.safetensors"))) > 1
    torch.testing.assert_close(last_logits(load_model(str(folder))), last_logits(tiny_models["qwen2_bias"][0]))


def test_shard_listed_in_the_index_but_absent(tiny_model_dirs, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(tiny_model_dirs["qwen2_bias"]).save_pretrained(folder, max_shard_size="100KB")
    sorted(folder.glob("model-*.safetensors"))[-1].unlink()
    with pytest.raises(ModelLoadError, match="listed in the index is missing"):
        load_model(str(folder))


def test_models_load_in_another_dtype(tiny_model_dirs):
    loaded = load_model(str(tiny_model_dirs["llama_gqa_llama3"]), dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in loaded.model.parameters())
    assert last_logits(loaded).dtype == torch.float64


def test_unsupported_gguf_architecture(tmp_path):
    import gguf

    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="unsupported GGUF architecture 'gpt2'"):
        load_model(str(path))


def test_gguf_with_separate_output_matches_transformers(tiny_model_dirs, tiny_models, tmp_path):
    path = tmp_path / "untied.gguf"
    write_gguf(tiny_model_dirs["llama_untied"], path)
    loaded = load_model(str(path))
    assert not loaded.config.tie_word_embeddings and loaded.model.embed_tokens is not None
    expected = hf_last_logits(tiny_models["llama_untied"][1], PROMPT)
    torch.testing.assert_close(last_logits(loaded), expected, rtol=1e-4, atol=1e-4)
