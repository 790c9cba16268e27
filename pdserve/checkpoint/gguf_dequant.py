"""GGUF tensor bytes -> float32, whole tensors at once, in vectorised numpy (one thread: it
never waits on a busy machine's other cores the way a many-op torch pass does).

Each kernel takes the blocks of a tensor, [n, block bytes] uint8, and returns [n, block
elements] float32 computing exactly what gguf.quants.dequantize computes (the same float32
operations in the same order: bit for bit equal). A type without a kernel here falls back to
gguf.quants (NotImplementedError where that has none either).

    Q4_0   f16 d | 16 B nibbles                       d * (q - 8)
    Q4_1   f16 d | f16 m | 16 B nibbles               d * q + m
    Q5_0   f16 d | u32 high bits | 16 B nibbles       d * (q - 16)
    Q5_1   f16 d | f16 m | u32 high bits | nibbles    d * q + m
    Q8_0   f16 d | 32 x i8                            q * d
    Q4_K   f16 d | f16 dmin | 12 B 6-bit scales/mins | 128 B nibbles    (d*sc) * q - dmin*mn
    Q5_K   as Q4_K plus 32 B of fifth bits
    Q6_K   128 B low nibbles | 64 B 2-bit highs | 16 x i8 scales | f16 d   (d*sc) * (q - 32)
    Q2_K   16 B 4-bit scale/min pairs | 64 B 2-bit q | f16 d | f16 dmin  (d*sc) * q - dmin*mn
    Q3_K   32 B high-bit mask | 64 B 2-bit low q | 12 B 6-bit scales | f16 d
                                                     (d*(sc-32)) * (q - 4 where the mask bit is 0)

Nibbles: byte j holds element j (low nibble) and element j + 16 (high nibble) of a 32-run.
2-bit values (Q2_K, Q3_K, Q6_K's highs): byte j of a 32-byte run holds, from its low bits up,
element j of each of four consecutive 32-runs.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from pdserve.checkpoint.gguf_file import BLOCK_SIZES, GGMLType

Kernel = Callable[[np.ndarray], np.ndarray]  # [n, block bytes] uint8 -> [n, block elements] float32


def dequantize(raw: np.ndarray, kind: GGMLType) -> np.ndarray:
    """[rows, row_bytes] uint8 -> [rows, row elements] float32, a new array (never a view of `raw`)."""
    kernel = KERNELS.get(kind)
    values = _gguf_py(raw, kind) if kernel is None else kernel(raw.reshape(-1, BLOCK_SIZES[kind].nbytes))
    return values.reshape(raw.shape[0], -1)


def dequantizable(kind: GGMLType) -> bool:
    """Whether `dequantize` computes this type (here, or in gguf-py: tried on one block of zeros)."""
    if kind in KERNELS:
        return True
    try:
        _gguf_py(np.zeros((1, BLOCK_SIZES[kind].nbytes), dtype=np.uint8), kind)
    except NotImplementedError:
        return False
    return True


def _gguf_py(raw: np.ndarray, kind: GGMLType) -> np.ndarray:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    try:
        gguf_kind = GGMLQuantizationType(int(kind))
    except ValueError:
        raise NotImplementedError(f"gguf-py does not know type {kind.name}") from None
    return np.array(gguf_dequantize(raw, gguf_kind), dtype=np.float32)


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """[n, 1] float32: the float16 at bytes [start, start + 2) of each block."""
    return np.ascontiguousarray(blocks[:, start:start + 2]).view(np.float16).astype(np.float32)


def _nibbles(packed: np.ndarray, run: int, dtype: type) -> np.ndarray:
    """[n, k] uint8 -> [n, 2 k] of `dtype`: per run of `run` bytes, its low nibbles then its high ones."""
    n, k = packed.shape
    runs = packed.reshape(n, k // run, run)
    out = np.empty((n, k // run, 2, run), dtype)
    np.bitwise_and(runs, 0x0F, out=out[:, :, 0], casting="unsafe")
    np.right_shift(runs, 4, out=out[:, :, 1], casting="unsafe")
    return out.reshape(n, 2 * k)


def _bits(packed: np.ndarray) -> np.ndarray:
    """[n, k] uint8 -> [n, 8, k] uint8: bit b of byte j at [:, b, j]."""
    return (packed[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1


_SIXTEENS = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(np.uint8) << 4  # [byte, bit] -> 0 or 16


def _fifth_bits(blocks: np.ndarray, start: int) -> np.ndarray:
    """[n, 32] uint8: bit i of the little-endian u32 at `start`, as 16, for element i (bit i % 8
    of byte i // 8: one table row per byte)."""
    return _SIXTEENS[blocks[:, start:start + 4]].reshape(-1, 32)


def _f32(blocks: np.ndarray) -> np.ndarray:
    return blocks.view(np.float32).copy()


def _f16(blocks: np.ndarray) -> np.ndarray:
    return blocks.view(np.float16).astype(np.float32)


def _bf16(blocks: np.ndarray) -> np.ndarray:
    return (blocks.view(np.int16).astype(np.int32) << 16).view(np.float32)


def _q4_0(blocks: np.ndarray) -> np.ndarray:
    q = _nibbles(blocks[:, 2:], 16, np.float32)
    q -= 8
    q *= _half(blocks, 0)
    return q


def _q4_1(blocks: np.ndarray) -> np.ndarray:
    q = _nibbles(blocks[:, 4:], 16, np.float32)
    q *= _half(blocks, 0)
    q += _half(blocks, 2)
    return q


def _q5_0(blocks: np.ndarray) -> np.ndarray:
    q = (_nibbles(blocks[:, 6:], 16, np.uint8) | _fifth_bits(blocks, 2)).astype(np.float32)
    q -= 16
    q *= _half(blocks, 0)
    return q


def _q5_1(blocks: np.ndarray) -> np.ndarray:
    q = (_nibbles(blocks[:, 8:], 16, np.uint8) | _fifth_bits(blocks, 4)).astype(np.float32)
    q *= _half(blocks, 0)
    q += _half(blocks, 2)
    return q


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    q = blocks[:, 2:].view(np.int8).astype(np.float32)
    q *= _half(blocks, 0)
    return q


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes of 6-bit values -> (scales, mins), each [n, 8] uint8:

        bytes 0-3  scale 0-3 (low 6 bits), top 2 bits: high bits of scale 4-7
        bytes 4-7  min 0-3 (low 6 bits),   top 2 bits: high bits of min 4-7
        bytes 8-11 low nibble: scale 4-7's low 4 bits, high nibble: min 4-7's
    """
    d, m, low = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([d & 0x3F, (low & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mins = np.concatenate([m & 0x3F, (low >> 4) | ((m >> 2) & 0x30)], axis=1)
    return scales, mins


def _k_affine(blocks: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K: q [n, 8, 32] float32, its 8 sub-blocks -> (d * scale) * q - dmin * min, [n, 256]."""
    scales, mins = _k_scales(blocks[:, 4:16])
    q *= (_half(blocks, 0) * scales.astype(np.float32))[:, :, None]
    q -= (_half(blocks, 2) * mins.astype(np.float32))[:, :, None]
    return q.reshape(-1, 256)


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    return _k_affine(blocks, _nibbles(blocks[:, 16:144], 32, np.float32).reshape(-1, 8, 32))


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    low = _nibbles(blocks[:, 48:176], 32, np.uint8).reshape(-1, 8, 32)
    return _k_affine(blocks, (low | (_bits(blocks[:, 16:48]) << 4)).astype(np.float32))


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    low = _nibbles(blocks[:, :128], 64, np.uint8).reshape(-1, 8, 32)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    high = ((blocks[:, 128:192].reshape(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, 8, 32)
    q = ((low | (high << 4)).view(np.int8) - np.int8(32)).astype(np.float32).reshape(-1, 16, 16)
    q *= (_half(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32))[:, :, None]
    return q.reshape(-1, 256)


_CRUMB_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)


def _crumbs(packed: np.ndarray) -> np.ndarray:
    """[n, 32 k] uint8 -> [n, 16, 8 k] uint8: the 2-bit values, element order (see the docstring)."""
    n = packed.shape[0]
    return ((packed.reshape(n, -1, 1, 32) >> _CRUMB_SHIFTS) & 3).reshape(n, 16, -1)


def _q2_k(blocks: np.ndarray) -> np.ndarray:
    scales = blocks[:, :16]
    q = _crumbs(blocks[:, 16:80]).astype(np.float32)  # [n, 16, 16]
    q *= (_half(blocks, 80) * (scales & 0x0F).astype(np.float32))[:, :, None]
    q -= (_half(blocks, 82) * (scales >> 4).astype(np.float32))[:, :, None]
    return q.reshape(-1, 256)


def _q3_scales(packed: np.ndarray) -> np.ndarray:
    """12 bytes -> [n, 16] float32, each 6-bit scale less 32: bytes 0-7 hold the low nibbles of
    scales 0-7 (low) and 8-15 (high), bytes 8-11 their top two bits, four scales a byte."""
    n = packed.shape[0]
    low = (packed[:, None, :8] >> np.array([0, 4], dtype=np.uint8)[None, :, None]).reshape(n, 16)
    high = (packed[:, None, 8:] >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, :, None]).reshape(n, 16)
    return (((low & 0x0F) | ((high & 3) << 4)).view(np.int8) - np.int8(32)).astype(np.float32)


def _q3_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    high = ((blocks[:, None, :32] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1).reshape(n, 16, 16)
    q = (_crumbs(blocks[:, 32:96]).view(np.int8) - ((high ^ 1) << 2).view(np.int8)).astype(np.float32)
    q *= (_half(blocks, 108) * _q3_scales(blocks[:, 96:108]))[:, :, None]
    return q.reshape(-1, 256)


KERNELS: dict[GGMLType, Kernel] = {
    GGMLType.F32: _f32,
    GGMLType.F16: _f16,
    GGMLType.BF16: _bf16,
    GGMLType.Q4_0: _q4_0,
    GGMLType.Q4_1: _q4_1,
    GGMLType.Q5_0: _q5_0,
    GGMLType.Q5_1: _q5_1,
    GGMLType.Q8_0: _q8_0,
    GGMLType.Q4_K: _q4_k,
    GGMLType.Q5_K: _q5_k,
    GGMLType.Q6_K: _q6_k,
    GGMLType.Q2_K: _q2_k,
    GGMLType.Q3_K: _q3_k,
}
