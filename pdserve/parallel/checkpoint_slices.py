"""A checkpoint's tensors read a slice at a time, so a tensor-parallel rank reads its share only.

    SafetensorsSlices   a transformers folder: `safe_open(...).get_slice(name)[...]` reads the
                        slice's bytes from the mapped file, rows or columns alike
    GGUFSlices          a GGUF file: rows of any type (quantisation blocks run along a row);
                        columns where both ends fall on a quantisation block (32 or 256 columns;
                        every column for F32/F16), else the whole tensor is read and narrowed

Both present tensors under the transformers names and shapes ([out, in] for projections) and
count `bytes_read`: the stored bytes taken from the file (quantised bytes for GGUF).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, NamedTuple

import torch

from pdserve.checkpoint.model_config import ModelConfig
from pdserve.checkpoint.errors import ModelLoadError


class Cut(NamedTuple):
    """Elements [start, start + size) along `dim` (0: rows, 1: columns)."""

    dim: int
    start: int
    size: int


class CheckpointSlices(ABC):
    config: ModelConfig
    bytes_read: int = 0

    @abstractmethod
    def shape(self, name: str) -> tuple[int, ...]:
        """The full tensor's shape; KeyError when the checkpoint has no such tensor."""

    @abstractmethod
    def read(self, name: str, cut: Cut | None) -> torch.Tensor:
        """The tensor (cut None) or its slice, as stored (GGUF: dequantised to float32)."""

    def close(self) -> None:
        """Release open files (nothing to do for most implementations)."""


class SafetensorsSlices(CheckpointSlices):
    def __init__(self, folder: Path):
        from pdserve.checkpoint.hf_config import read_hf_config
        from pdserve.model.hf_loader import ShardSet, tensor_index

        self.config = read_hf_config(folder)
        self._folder, self._index = folder, tensor_index(folder)
        self._shards = ShardSet(folder)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def read(self, name: str, cut: Cut | None) -> torch.Tensor:
        part = self._slice(name)
        tensor = part[:] if cut is None else part[_index(cut)]
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def close(self) -> None:
        self._shards.close()

    def _slice(self, name: str) -> Any:
        from safetensors import SafetensorError

        file = self._index[name]
        try:
            return self._shards.handle(file).get_slice(name)
        except SafetensorError as exc:
            raise ModelLoadError(f"{self._folder / file}: cannot read tensor {name!r}: {exc}") from exc


class _Stored(NamedTuple):
    """A GGUF tensor's entry and its stored bytes ([rows, row_bytes] uint8, a view of the file)."""

    info: Any  # pdserve.checkpoint.gguf_file.GGUFTensor
    data: Any  # numpy array


class GGUFSlices(CheckpointSlices):
    """q_proj and k_proj rows are read in GGUF's interleaved order and put back per head (a
    rank's cut is whole heads, so a slice of the file's rows is the same heads)."""

    def __init__(self, path: Path):
        from pdserve.model.gguf_loader import open_gguf_checkpoint

        self._checkpoint = open_gguf_checkpoint(path)
        self.config = self._checkpoint.config
        file = self._checkpoint.file
        self._tensors = {name: _Stored(t, file.raw(t)) for name, t in self._checkpoint.tensors.items()}

    def shape(self, name: str) -> tuple[int, ...]:
        return self._tensors[name].info.shape

    def read(self, name: str, cut: Cut | None) -> torch.Tensor:
        stored = self._tensors[name]
        if cut is None or len(stored.info.dims) == 1:
            self.bytes_read += stored.data.nbytes
            values = self._checkpoint.read(name)
            return values if cut is None else values.narrow(0, cut.start, cut.size)
        data, narrow = self._stored(stored, cut)
        self.bytes_read += data.nbytes
        values = self._checkpoint.read(name, data)
        return values if narrow is None else values.narrow(narrow.dim, narrow.start, narrow.size)

    @staticmethod
    def _stored(stored: _Stored, cut: Cut) -> tuple[Any, Cut | None]:
        """The stored bytes a cut of a matrix needs, and the cut still to apply once dequantised."""
        import numpy as np

        from pdserve.checkpoint.gguf_file import BLOCK_SIZES

        data = stored.data
        if cut.dim == 0:
            return data[cut.start:cut.start + cut.size], None
        block = BLOCK_SIZES[stored.info.kind]
        if cut.start % block.elements or cut.size % block.elements:
            return data, cut
        first, last = cut.start // block.elements * block.nbytes, (cut.start + cut.size) // block.elements * block.nbytes
        return np.ascontiguousarray(data[:, first:last]), None


def open_slices(source: Path) -> CheckpointSlices:
    """The reader for a resolved model path (pdserve.checkpoint.source.resolve_model_path)."""
    if source.is_dir():
        if not (source / "config.json").is_file():
            raise ModelLoadError(f"{source}: no config.json (expected a transformers checkpoint folder or a .gguf file)")
        return SafetensorsSlices(source)
    if source.suffix == ".gguf":
        return GGUFSlices(source)
    raise ModelLoadError(f"{source}: expected a .gguf file or a folder with config.json and *.safetensors")


def _index(cut: Cut) -> tuple[slice, ...]:
    span = slice(cut.start, cut.start + cut.size)
    return (span,) if cut.dim == 0 else (slice(None), span)
