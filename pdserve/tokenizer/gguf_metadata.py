"""Read the key/value metadata of a GGUF file, without touching its tensors (the project's one GGUF
reader, pdserve/checkpoint/gguf_file.py, does the reading), so a tokenizer loads in a fraction of a second."""

from __future__ import annotations

from pdserve.checkpoint.gguf_file import GGUFFormatError, GGUFValueType, read_gguf_metadata

__all__ = ["GGUFFormatError", "GGUFValueType", "read_gguf_metadata"]
