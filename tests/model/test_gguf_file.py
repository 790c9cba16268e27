"""The project's GGUF reader: the embedded file read as gguf-py reads it, damaged files refused."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from pdserve.checkpoint.gguf_file import BLOCK_SIZES, GGMLType, GGUFFile, GGUFFormatError, read_gguf_metadata
from tests.model.gguf_bytes import gguf_bytes, string, write


@pytest.fixture(scope="module")
def ours(embedded_gguf_path) -> GGUFFile:
    return GGUFFile(embedded_gguf_path)


@pytest.mark.timeout(300)
def test_every_tensor_reads_as_gguf_py_reads_it(ours, embedded_gguf_path):
    import gguf

    reader = gguf.GGUFReader(str(embedded_gguf_path))
    assert [t.name for t in reader.tensors] == list(ours.tensors)
    assert ours.data_start == reader.data_offset
    for expected in reader.tensors:
        tensor = ours.tensors[expected.name]
        assert tensor.dims == tuple(int(n) for n in expected.shape)
        assert int(tensor.kind) == int(expected.tensor_type)
        assert tensor.offset + ours.data_start == expected.data_offset
        assert np.array_equal(ours.raw(tensor).ravel(), np.asarray(expected.data).view(np.uint8).ravel())
    for key in ("general.architecture", "llama.block_count", "tokenizer.ggml.eos_token_id", "general.alignment"):
        if key in reader.fields:
            assert ours.metadata[key] == reader.fields[key].contents()
    assert ours.metadata["tokenizer.ggml.tokens"] == reader.fields["tokenizer.ggml.tokens"].contents()


def test_embedded_file_holds_what_the_model_ships(ours):
    kinds = [t.kind for t in ours.tensors.values()]
    assert (kinds.count(GGMLType.Q4_1), kinds.count(GGMLType.F32), kinds.count(GGMLType.Q8_0)) == (210, 61, 1)
    assert ours.tensors["token_embd.weight"].shape == (49152, 576)


def test_key_values_alone_are_those_of_the_whole_file(ours, embedded_gguf_path):
    assert read_gguf_metadata(embedded_gguf_path) == ours.metadata


def test_block_sizes_are_ggmls():
    from gguf.constants import GGML_QUANT_SIZES

    assert {int(kind): size for kind, size in BLOCK_SIZES.items()} == {
        int(kind): size for kind, size in GGML_QUANT_SIZES.items()
    }
    assert {kind.name for kind in GGMLType} == {kind.name for kind in GGML_QUANT_SIZES}


@pytest.mark.parametrize("keep", [3, 20, 1000, 1_785_000, 3_000_000, -1])
def test_a_truncated_file_is_refused(tmp_path, embedded_gguf_path, keep):
    data = Path(embedded_gguf_path).read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:keep])
    with pytest.raises(GGUFFormatError, match="cut.gguf: (truncated|not a GGUF file)"):
        GGUFFile(path)


def test_a_minimal_file_reads(tmp_path):
    values = np.arange(64, dtype=np.float32)
    file = GGUFFile(write(tmp_path, gguf_bytes(data=values.tobytes())))
    (tensor,) = file.tensors.values()
    assert (tensor.shape, tensor.kind, file.data_start % 32) == ((2, 32), GGMLType.F32, 0)
    assert np.array_equal(file.raw(tensor).view(np.float32), values.reshape(2, 32))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"NOPE" + bytes(64), "bad magic"),
        (b"", "empty"),
        (gguf_bytes(version=4), "unsupported GGUF version 4"),
        (gguf_bytes(((("w", (32,), 77, 0)),)), "unknown type id 77"),
        (gguf_bytes(((("w", (32, 1, 1, 1, 1), 0, 0)),)), "5 dimensions"),
        (gguf_bytes(((("w", (48,), int(GGMLType.Q4_1), 0)),)), "not whole Q4_1 blocks of 32"),
        (gguf_bytes(((("w", (8,), 0, 4)),)), "offset 4 is not 32-aligned"),
        (gguf_bytes(((("w", (8,), 0, 0)), ("w", (8,), 0, 32))), "listed twice"),
        (gguf_bytes(((("w", (32, 4), 0, 0)),)), "truncated: tensor 'w' ends 512 bytes into a data section of 256"),
        (gguf_bytes(kvs=string("general.alignment") + struct.pack("<II", 4, 24), kv_count=1), "not a power of two"),
        (gguf_bytes(kvs=string("k") + struct.pack("<I", 99), kv_count=1), "corrupt GGUF header"),
        (gguf_bytes(kvs=string("k") + struct.pack("<IIQ", 9, 8, 1 << 40), kv_count=1), "truncated"),
    ],
)
def test_a_damaged_file_is_a_clear_error(tmp_path, data, message):
    with pytest.raises(GGUFFormatError, match=message):
        GGUFFile(write(tmp_path, data))
