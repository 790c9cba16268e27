"""Read the key/value metadata of a GGUF file, without touching its tensors.

GGUF layout (little-endian), as far as this reader goes:

    magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count | kv_count x KV | tensor infos...
    KV     = string key | u32 value_type | value
    string = u64 byte_length | utf-8 bytes
    array  = u32 item_type | u64 count | count x item

The tensor section is never read, so a tokenizer loads in a fraction of a second.
"""

from __future__ import annotations

import enum
import mmap
import struct
from typing import Any

import numpy as np

_MAGIC = b"GGUF"


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


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


class _Cursor:
    """A read position over the file's bytes."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        raw = self.data[self.pos : self.pos + length]
        self.pos += length
        return raw.decode("utf-8", errors="replace")

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
            size = struct.calcsize(fmt)
            raw = self.data[self.pos : self.pos + size * count]
            self.pos += size * count
            return np.frombuffer(raw, dtype=np.dtype(fmt)).tolist()
        return [self.value(kind) for _ in range(count)]


def read_gguf_metadata(path: str) -> dict[str, Any]:
    """All metadata key/value pairs of a GGUF file (arrays as Python lists)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _read_header(_Cursor(data), path)


def _read_header(cursor: _Cursor, path: str) -> dict[str, Any]:
    if cursor.data[:4] != _MAGIC:
        raise GGUFFormatError(f"{path}: not a GGUF file (bad magic)")
    cursor.pos = 4
    version = cursor.unpack("<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"{path}: unsupported GGUF version {version} (big-endian or too new?)")
    cursor.unpack("<Q")
    kv_count = cursor.unpack("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cursor.string()
        metadata[key] = cursor.value(GGUFValueType(cursor.unpack("<I")))
    return metadata
