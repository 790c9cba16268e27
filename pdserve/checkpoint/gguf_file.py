"""A GGUF file read in place: key/values, tensor infos, and each tensor's stored bytes as a view
of one read-only mmap (numpy only; nothing is dequantised here).

GGUF layout (little-endian, versions 2 and 3):

    magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count | kv_count x KV
                 | tensor_count x TensorInfo | padding to general.alignment (32) | data section
    KV         = string key | u32 value_type | value
    string     = u64 byte_length | utf-8 bytes
    array      = u32 item_type | u64 count | count x item
    TensorInfo = string name | u32 n_dims | n_dims x u64 dim | u32 ggml_type | u64 offset
                 (dim 0 is a row's length; offset counts from the data section's start)

A tensor's bytes are whole blocks along each row: a row of `dims[0]` elements is
`dims[0] // block elements` blocks of `block bytes` each (BLOCK_SIZES).
"""

from __future__ import annotations

import enum
import math
import mmap
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

_MAGIC = b"GGUF"
_MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands (bad magic, truncated, corrupt)."""


class GGUFValueType(enum.IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


class GGMLType(enum.IntEnum):
    """A tensor's storage type, numbered as ggml numbers them."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


class BlockSize(NamedTuple):
    elements: int  # values in one block
    nbytes: int  # bytes one block is stored in


_K = 256
BLOCK_SIZES: dict[GGMLType, BlockSize] = {
    GGMLType.F32: BlockSize(1, 4), GGMLType.F16: BlockSize(1, 2), GGMLType.BF16: BlockSize(1, 2),
    GGMLType.F64: BlockSize(1, 8), GGMLType.I8: BlockSize(1, 1), GGMLType.I16: BlockSize(1, 2),
    GGMLType.I32: BlockSize(1, 4), GGMLType.I64: BlockSize(1, 8),
    GGMLType.Q4_0: BlockSize(32, 18), GGMLType.Q4_1: BlockSize(32, 20), GGMLType.Q5_0: BlockSize(32, 22),
    GGMLType.Q5_1: BlockSize(32, 24), GGMLType.Q8_0: BlockSize(32, 34), GGMLType.Q8_1: BlockSize(32, 40),
    GGMLType.IQ4_NL: BlockSize(32, 18), GGMLType.MXFP4: BlockSize(32, 17), GGMLType.NVFP4: BlockSize(64, 36),
    GGMLType.Q1_0: BlockSize(128, 18),
    GGMLType.Q2_K: BlockSize(_K, 84), GGMLType.Q3_K: BlockSize(_K, 110), GGMLType.Q4_K: BlockSize(_K, 144),
    GGMLType.Q5_K: BlockSize(_K, 176), GGMLType.Q6_K: BlockSize(_K, 210), GGMLType.Q8_K: BlockSize(_K, 292),
    GGMLType.IQ2_XXS: BlockSize(_K, 66), GGMLType.IQ2_XS: BlockSize(_K, 74), GGMLType.IQ3_XXS: BlockSize(_K, 98),
    GGMLType.IQ1_S: BlockSize(_K, 50), GGMLType.IQ3_S: BlockSize(_K, 110), GGMLType.IQ2_S: BlockSize(_K, 82),
    GGMLType.IQ4_XS: BlockSize(_K, 136), GGMLType.IQ1_M: BlockSize(_K, 56), GGMLType.TQ1_0: BlockSize(_K, 54),
    GGMLType.TQ2_0: BlockSize(_K, 66),
}


class GGUFTensor(NamedTuple):
    """One tensor's entry in the file (no data)."""

    name: str
    dims: tuple[int, ...]  # GGUF order: dims[0] is a row's length
    kind: GGMLType
    offset: int  # from the data section's start

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy / torch order: [..., rows, row length]."""
        return tuple(reversed(self.dims))

    @property
    def rows(self) -> int:
        return math.prod(self.dims[1:])

    @property
    def row_bytes(self) -> int:
        block = BLOCK_SIZES[self.kind]
        return self.dims[0] // block.elements * block.nbytes

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


class _Cursor:
    """A read position over the file's bytes; reads past the end raise GGUFFormatError."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.pos = 0
        self.size = len(data)

    def take(self, nbytes: int) -> bytes:
        end = self.pos + nbytes
        if nbytes < 0 or end > self.size:
            raise GGUFFormatError(f"truncated: {nbytes} bytes wanted at byte {self.pos} of {self.size}")
        raw, self.pos = self.data[self.pos:end], end
        return raw

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.unpack("<Q")).decode("utf-8", errors="replace")

    def value(self, kind: GGUFValueType) -> Any:
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            return self.array()
        return self.unpack(_SCALAR_FORMATS[kind])

    def array(self) -> list[Any]:
        kind = GGUFValueType(self.unpack("<I"))
        count = self.unpack("<Q")
        if kind in _SCALAR_FORMATS:
            fmt = _SCALAR_FORMATS[kind]
            return np.frombuffer(self.take(struct.calcsize(fmt) * count), dtype=np.dtype(fmt)).tolist()
        if kind == GGUFValueType.STRING:
            return self.strings(count)
        return [self.value(kind) for _ in range(count)]

    def strings(self, count: int) -> list[str]:
        if count * 8 > self.size - self.pos:
            raise GGUFFormatError(f"truncated: {count} strings cannot fit after byte {self.pos}")
        data, pos, size, out = self.data, self.pos, self.size, []
        length = struct.Struct("<Q").unpack_from
        for _ in range(count):
            (n,) = length(data, pos)
            pos += 8
            if pos + n > size:
                raise GGUFFormatError(f"truncated: a {n}-byte string at byte {pos} of {size}")
            out.append(data[pos:pos + n].decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return out

    def tensor_info(self) -> GGUFTensor:
        name = self.string()
        n_dims = self.unpack("<I")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise GGUFFormatError(f"tensor {name!r} has {n_dims} dimensions (1 to {_MAX_DIMS} allowed)")
        dims = tuple(self.unpack("<Q") for _ in range(n_dims))
        kind_id = self.unpack("<I")
        if kind_id not in GGMLType._value2member_map_:
            raise GGUFFormatError(f"tensor {name!r} has unknown type id {kind_id}")
        return GGUFTensor(name, dims, GGMLType(kind_id), self.unpack("<Q"))


def _read_header(cursor: _Cursor) -> tuple[int, int]:
    """-> (tensor_count, kv_count), the cursor after them."""
    if cursor.data[:4] != _MAGIC:
        raise GGUFFormatError("not a GGUF file (bad magic)")
    cursor.pos = 4
    version = cursor.unpack("<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"unsupported GGUF version {version} (big-endian or too new?)")
    return cursor.unpack("<Q"), cursor.unpack("<Q")


def _read_metadata(cursor: _Cursor, kv_count: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cursor.string()
        metadata[key] = cursor.value(GGUFValueType(cursor.unpack("<I")))
    return metadata


def _map(path: Path) -> mmap.mmap:
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            raise GGUFFormatError(f"{path}: not a GGUF file (empty)")
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _parsing(path: Path, parse):
    """`parse()`, with any error a damaged file provokes reported as GGUFFormatError naming `path`."""
    try:
        return parse()
    except GGUFFormatError as exc:
        raise GGUFFormatError(f"{path}: {exc}") from None
    except (struct.error, ValueError, OverflowError) as exc:
        raise GGUFFormatError(f"{path}: corrupt GGUF header ({type(exc).__name__}: {exc})") from exc


class GGUFFile:
    """An opened GGUF file. `metadata`: every key/value (arrays as lists); `tensors`: name ->
    entry, in file order; `raw(tensor)`: its stored bytes, a read-only view of the mapping.
    Raises GGUFFormatError for a file that is not GGUF, truncated or inconsistent."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._map = _map(self.path)
        try:
            self.metadata, self.tensors, self.data_start = _parsing(self.path, self._parse)
        except GGUFFormatError:
            self._map.close()
            raise

    def raw(self, tensor: GGUFTensor) -> np.ndarray:
        """[rows, row_bytes] uint8: the tensor's blocks, row by row."""
        start = self.data_start + tensor.offset
        data = np.frombuffer(self._map, dtype=np.uint8, count=tensor.nbytes, offset=start)
        return data.reshape(tensor.rows, tensor.row_bytes)

    def _parse(self) -> tuple[dict[str, Any], dict[str, GGUFTensor], int]:
        cursor = _Cursor(self._map)
        tensor_count, kv_count = _read_header(cursor)
        metadata = _read_metadata(cursor, kv_count)
        tensors: dict[str, GGUFTensor] = {}
        for _ in range(tensor_count):
            tensor = cursor.tensor_info()
            if tensor.name in tensors:
                raise GGUFFormatError(f"tensor {tensor.name!r} is listed twice")
            tensors[tensor.name] = tensor
        alignment = _alignment(metadata)
        data_start = -(-cursor.pos // alignment) * alignment
        for tensor in tensors.values():
            _check_tensor(tensor, alignment, cursor.size - data_start)
        return metadata, tensors, data_start


def _alignment(metadata: dict[str, Any]) -> int:
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"general.alignment {alignment!r} is not a power of two")
    return alignment


def _check_tensor(tensor: GGUFTensor, alignment: int, data_size: int) -> None:
    block = BLOCK_SIZES[tensor.kind]
    if tensor.dims[0] % block.elements:
        raise GGUFFormatError(
            f"tensor {tensor.name!r}: rows of {tensor.dims[0]} are not whole {tensor.kind.name} blocks "
            f"of {block.elements}"
        )
    if tensor.offset % alignment:
        raise GGUFFormatError(f"tensor {tensor.name!r}: offset {tensor.offset} is not {alignment}-aligned")
    if tensor.offset + tensor.nbytes > data_size:
        raise GGUFFormatError(
            f"truncated: tensor {tensor.name!r} ends {tensor.offset + tensor.nbytes} bytes into a data "
            f"section of {data_size}"
        )


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """All metadata key/value pairs of a GGUF file (arrays as lists); the tensor section is not read."""
    path = Path(path)
    data = _map(path)

    def parse() -> dict[str, Any]:
        cursor = _Cursor(data)
        _, kv_count = _read_header(cursor)
        return _read_metadata(cursor, kv_count)

    try:
        return _parsing(path, parse)
    finally:
        data.close()
