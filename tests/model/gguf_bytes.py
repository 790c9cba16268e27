"""Small GGUF files built byte by byte, for the reader's and dequantiser's tests."""

from __future__ import annotations

import struct
from pathlib import Path

from pdserve.checkpoint.gguf_file import GGMLType


def gguf_bytes(tensors=(("w", (32, 2), int(GGMLType.F32), 0),), kvs=b"", kv_count=0, version=3,
               data: bytes = bytes(256)) -> bytes:
    """A minimal GGUF file: the given KV bytes, tensor infos (name, dims, type id, offset), data."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), kv_count) + kvs
    for name, dims, kind, offset in tensors:
        out += string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", kind, offset)
    return out + bytes(-len(out) % 32) + data


def string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def write(tmp_path, data: bytes) -> Path:
    path = tmp_path / "small.gguf"
    path.write_bytes(data)
    return path
