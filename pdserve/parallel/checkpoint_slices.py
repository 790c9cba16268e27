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

from pdserve.model.config import ModelConfig
from pdserve.model.errors import ModelLoadError


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
        from pdserve.model.hf_loader import _tensor_index, read_hf_config

        self.config = read_hf_config(folder)
        self._folder, self._index = folder, _tensor_index(folder)
        self._handles: dict[str, Any] = {}

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def read(self, name: str, cut: Cut | None) -> torch.Tensor:
        part = self._slice(name)
        tensor = part[:] if cut is None else part[_index(cut)]
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def close(self) -> None:
        for handle in self._handles.values():
            handle.__exit__(None, None, None)
        self._handles.clear()

    def _slice(self, name: str) -> Any:
        from safetensors import SafetensorError

        file = self._index[name]
        try:
            return self._handle(file).get_slice(name)
        except SafetensorError as exc:
            raise ModelLoadError(f"{self._folder / file}: cannot read tensor {name!r}: {exc}") from exc

    def _handle(self, file: str) -> Any:
        from pdserve.model.hf_loader import _open

        if file not in self._handles:
            path = self._folder / file
            if not path.is_file():
                raise ModelLoadError(f"{self._folder}: shard {file} listed in the index is missing")
            self._handles[file] = _open(path).__enter__()
        return self._handles[file]


class _Quantised(NamedTuple):
    """What gguf_loader's dequantisation reads of a tensor."""

    name: str
    data: Any  # numpy array, [rows, stored units of a row] (1-D for vectors)
    tensor_type: Any


class GGUFSlices(CheckpointSlices):
    """q_proj and k_proj rows are read in GGUF's interleaved order and put back per head (a
    rank's cut is whole heads, so a slice of the file's rows is the same heads)."""

    def __init__(self, path: Path):
        from pdserve.model.gguf_loader import _hf_name, gguf_config, gguf_metadata, open_gguf

        reader = open_gguf(path)
        self._path = path
        self._tensors = {_hf_name(t.name): t for t in reader.tensors}
        self.config = gguf_config(gguf_metadata(reader), self._tensors, fallback_name=path.stem)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(n) for n in reversed(self._tensors[name].shape))

    def read(self, name: str, cut: Cut | None) -> torch.Tensor:
        from pdserve.model.gguf_loader import _dequantize, unpermute_rows

        tensor = self._tensors[name]
        data, narrow = self._stored(tensor, self.shape(name), cut)
        self.bytes_read += data.nbytes
        values = _dequantize(_Quantised(tensor.name, data, tensor.tensor_type), self._path)
        if narrow is not None:
            values = values.narrow(narrow.dim, narrow.start, narrow.size)
        if name.split(".")[-2] in ("q_proj", "k_proj"):
            return unpermute_rows(values, values.shape[0] // self.config.head_dim)
        return values

    def _stored(self, tensor: Any, shape: tuple[int, ...], cut: Cut | None) -> tuple[Any, Cut | None]:
        """The stored units the cut needs, and the cut still to apply once dequantised."""
        import numpy as np
        from gguf.constants import GGML_QUANT_SIZES

        data = tensor.data
        if cut is None:
            return data, None
        if cut.dim == 0:
            return data[cut.start:cut.start + cut.size], None
        block = GGML_QUANT_SIZES[tensor.tensor_type][0]
        if cut.start % block or cut.size % block:
            return data, cut
        units = data.shape[-1] // (shape[1] // block)  # stored units of one block
        first, last = cut.start // block * units, (cut.start + cut.size) // block * units
        return np.ascontiguousarray(data[:, first:last]), None


def open_slices(source: Path) -> CheckpointSlices:
    """The reader for a resolved model path (pdserve.model.loader.resolve_model_path)."""
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
