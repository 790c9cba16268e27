"""GGUF dequantisation: bit for bit what gguf-py computes, for the embedded file and random blocks."""

from __future__ import annotations

import numpy as np
import pytest

from pdserve.checkpoint.gguf_file import BLOCK_SIZES, GGMLType, GGUFFile, GGUFTensor
from pdserve.checkpoint.errors import UnsupportedModelError
from pdserve.checkpoint.gguf_dequant import KERNELS, dequantize
from pdserve.checkpoint.gguf_config import dequantize_rows
from tests.model.gguf_bytes import gguf_bytes, write

QUANTISABLE = (GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0)


def reference(raw: np.ndarray, kind: GGMLType) -> np.ndarray:
    """gguf-py's values for `raw` ([rows, row_bytes] uint8), [rows, row elements] float32."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    if kind == GGMLType.F32:
        return raw.view(np.float32)
    if kind == GGMLType.F16:
        return raw.view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):
        return gguf_dequantize(raw, GGMLQuantizationType(int(kind))).reshape(raw.shape[0], -1)


def assert_bits_equal(ours: np.ndarray, expected: np.ndarray) -> None:
    """Equal bit patterns (NaNs included)."""
    assert ours.dtype == np.float32 and ours.shape == expected.shape
    assert np.array_equal(np.ascontiguousarray(ours).view(np.uint32), np.ascontiguousarray(expected).view(np.uint32))


def ours(raw: np.ndarray, kind: GGMLType) -> np.ndarray:
    with np.errstate(all="ignore"):  # random bytes hold infinite scales and NaNs
        return dequantize(raw, kind)


def random_blocks(kind: GGMLType, rows: int = 6, blocks_per_row: int = 3, seed: int = 0) -> np.ndarray:
    size = BLOCK_SIZES[kind]
    return np.random.default_rng(seed).integers(0, 256, (rows, blocks_per_row * size.nbytes), dtype=np.uint8)


@pytest.mark.timeout(300)
def test_every_tensor_of_the_embedded_file(embedded_gguf_path):
    file = GGUFFile(embedded_gguf_path)
    for tensor in file.tensors.values():
        raw = file.raw(tensor)
        assert_bits_equal(dequantize(raw, tensor.kind), reference(raw, tensor.kind))


@pytest.mark.parametrize("kind", list(KERNELS), ids=lambda k: k.name)
def test_random_bytes(kind):
    raw = random_blocks(kind)
    assert_bits_equal(ours(raw, kind), reference(raw, kind))


@pytest.mark.parametrize("kind", QUANTISABLE, ids=lambda k: k.name)
def test_blocks_quantised_by_gguf_py(kind):
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quantize

    values = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32) * 3
    values[0] = 0.0
    raw = np.ascontiguousarray(quantize(values, GGMLQuantizationType(int(kind)))).view(np.uint8)
    ours = dequantize(raw.reshape(8, -1), kind)
    assert_bits_equal(ours, reference(raw.reshape(8, -1), kind))
    assert np.allclose(ours, values, atol=1.0)


def test_the_result_is_a_fresh_writable_array():
    raw = random_blocks(GGMLType.F32)
    raw.setflags(write=False)
    values = dequantize(raw, GGMLType.F32)
    values.fill(0)
    assert raw.any()


@pytest.mark.parametrize("kind", [GGMLType.IQ4_NL, GGMLType.IQ2_XS, GGMLType.TQ2_0], ids=lambda k: k.name)
def test_other_types_fall_back_to_gguf_py(kind):
    assert kind not in KERNELS
    raw = random_blocks(kind)
    assert_bits_equal(ours(raw, kind), reference(raw, kind))


def test_a_type_nobody_dequantises_is_unsupported(tmp_path):
    file = GGUFFile(write(tmp_path, gguf_bytes(((("w", (8, 2), int(GGMLType.I32), 0)),))))
    tensor: GGUFTensor = file.tensors["w"]
    with pytest.raises(UnsupportedModelError, match="tensor w type I32"):
        dequantize_rows(file, tensor, file.raw(tensor))


# the float16 fields of each type's block (d, and dmin where it has one), at these byte offsets
HALF_FIELDS = {GGMLType.Q4_0: (0,), GGMLType.Q5_0: (0,), GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,),
               GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,)}


@pytest.mark.parametrize("kind", list(HALF_FIELDS), ids=lambda k: k.name)
def test_blocks_with_the_scales_a_quantiser_writes(kind):
    """Random quants and sub-block scales under small finite float16 scales (gguf-py quantises
    none of the K types): finite values, bit for bit gguf-py's."""
    rng = np.random.default_rng(2)
    raw = random_blocks(kind, rows=16, blocks_per_row=2, seed=3).reshape(-1, BLOCK_SIZES[kind].nbytes)
    for at in HALF_FIELDS[kind]:
        raw[:, at:at + 2] = (rng.random((raw.shape[0], 1)) * 0.01).astype(np.float16).view(np.uint8)
    raw = raw.reshape(16, -1)
    values = dequantize(raw, kind)
    assert np.isfinite(values).all() and np.abs(values).max() > 0
    assert_bits_equal(values, reference(raw, kind))
