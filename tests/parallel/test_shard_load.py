"""Each rank reads its own slice of the checkpoint: its parameters equal the transform's shard of
the whole model, and the bytes it read are its share of the split tensors plus the replicated
ones (safetensors folders and the embedded GGUF)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from pdserve.checkpoint.errors import ModelLoadError
from pdserve.model.loader import load_model
from pdserve.parallel.checkpoint_slices import Cut, GGUFSlices, SafetensorsSlices, open_slices
from pdserve.parallel.communicator import InProcessGroup
from pdserve.parallel.shard import TensorParallelError, shard_model
from pdserve.parallel.shard_load import build_shard

pytestmark = pytest.mark.timeout(300)
REPLICATED = ("norm.weight", "o_proj.bias")


def _rank_shard(slices, path, world: int, rank: int):
    return build_shard(slices, str(path), "cpu", torch.float32, InProcessGroup(world).communicator(rank))


def _assert_same_parameters(shard, expected) -> None:
    got, want = shard.state_dict(), expected.state_dict()
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    assert shard.config == expected.config


def _stored_bytes(folder) -> tuple[int, int]:
    """(split, replicated) bytes of a safetensors checkpoint's tensors."""
    split = replicated = 0
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                nbytes = handle.get_slice(name)[:].numel() * 4
                if name.endswith(REPLICATED):
                    replicated += nbytes
                else:
                    split += nbytes
    return split, replicated


@pytest.mark.parametrize("name", ["llama_gqa_llama3", "qwen2_bias", "llama_untied"])
def test_a_rank_reads_its_slice_of_a_safetensors_checkpoint(tiny_model_dirs, name):
    path, world = tiny_model_dirs[name], 2
    split, replicated = _stored_bytes(path)
    for rank in range(world):
        slices = SafetensorsSlices(path)
        try:
            shard = _rank_shard(slices, path, world, rank)
        finally:
            slices.close()
        _assert_same_parameters(shard, shard_model(load_model(str(path)).model, InProcessGroup(world).communicator(rank)))
        assert slices.bytes_read == split // world + replicated


def test_a_rank_reads_its_slice_of_the_embedded_gguf(embedded_gguf_path):
    world, rank = 3, 1
    full = GGUFSlices(embedded_gguf_path)
    everything = sum(t.data.nbytes for name, t in full._tensors.items() if name != "rope_freqs.weight")
    replicated = sum(t.data.nbytes for name, t in full._tensors.items() if name.endswith(REPLICATED))
    slices = GGUFSlices(embedded_gguf_path)
    shard = _rank_shard(slices, embedded_gguf_path, world, rank)
    _assert_same_parameters(shard, shard_model(load_model(None).model, InProcessGroup(world).communicator(rank)))
    assert slices.bytes_read == (everything - replicated) // world + replicated


def test_gguf_columns_off_a_quantisation_block_are_read_whole_and_narrowed(embedded_gguf_path):
    slices = GGUFSlices(embedded_gguf_path)
    name = "model.layers.0.self_attn.o_proj.weight"
    whole = slices.read(name, None)
    before = slices.bytes_read
    part = slices.read(name, Cut(1, 5, 40))
    assert torch.equal(part, whole[:, 5:45])
    assert slices.bytes_read - before == slices._tensors[name].data.nbytes
    aligned = slices.read(name, Cut(1, 64, 128))
    assert torch.equal(aligned, whole[:, 64:192])


def test_a_size_that_does_not_divide_fails_before_reading(tiny_model_dirs):
    path = tiny_model_dirs["llama_gqa_llama3"]
    slices = open_slices(path)
    with pytest.raises(TensorParallelError, match="must divide"):
        _rank_shard(slices, path, 3, 0)
    assert slices.bytes_read == 0


def test_a_checkpoint_of_the_wrong_shape_names_the_tensor(tiny_model_dirs, tmp_path):
    import json
    import shutil

    path = tmp_path / "wrong"
    shutil.copytree(tiny_model_dirs["llama_gqa_llama3"], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "intermediate_size": 256}))
    with pytest.raises(ModelLoadError, match="gate_proj.weight"):
        _rank_shard(open_slices(path), path, 2, 0)
