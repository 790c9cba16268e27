"""A GGUF model's weights as the loader assembles them (dequantised, q/k rows unpermuted, the
projections transposed), kept on disk beside the compiled kernels, so a worker that starts again
(a restart, a test fleet, a second worker on the node) maps them instead of dequantising the file
again (about a second for the embedded model on one core, the largest part of a worker's start).

    files:  <cache>/weights/<name>.bin  the tensors back to back, each at a 64-byte boundary
            <name>.json                 name -> offset, shape, dtype; linked after the .bin, so
                                        its presence says the .bin is whole
    name:   <file stem>-<hash of its path and the dtype>-<key>; keeping one removes the others
            of that path and dtype (an earlier version of the file, an earlier loader)
    key:    sha256 of the GGUF file's size and modification time, the dtype, and the sources of
            the loader that assembled it (a changed file or loader assembles again)
    read:   torch.from_file, private: the pages are the page cache's, shared by every process on
            the machine that maps the same file (a write would copy its page; nothing writes)
    write:  the first writer wins (temporary files linked into place, never replaced)

CPU only (a GPU model is copied to the device anyway). An unwritable or full cache is not an
error: the weights are assembled, used and not kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path

import torch

from pdserve.kept_file import keep_file

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the files' layout changes
ALIGN = 64  # bytes: every tensor starts on a cache line (and any dtype's boundary)
State = dict[str, torch.Tensor]
# the files whose code decides what the assembled weights hold
LOADER_SOURCES = ("gguf_loader.py", "weights.py", "../checkpoint/gguf_dequant.py", "../checkpoint/gguf_file.py",
                  "../checkpoint/gguf_config.py")


def kept_weights(source: Path, dtype: torch.dtype, assemble: Callable[[], State], cache: Path) -> State:
    """The assembled state of `source` in `dtype`: mapped from `cache` where kept, else
    `assemble()`d now and kept there (then mapped, so this process shares the pages too)."""
    index_path, data_path = _paths(cache, source, dtype)
    found = _mapped(index_path, data_path)
    if found is not None:
        return found
    state = assemble()
    if not _keep(state, index_path, data_path):
        return state
    _remove_stale(index_path.parent, _prefix(source, dtype), keep={index_path.name, data_path.name})
    return _mapped(index_path, data_path) or state


def _paths(cache: Path, source: Path, dtype: torch.dtype) -> tuple[Path, Path]:
    name = f"{_prefix(source, dtype)}{_key(source, dtype)}"
    return cache / "weights" / f"{name}.json", cache / "weights" / f"{name}.bin"


def _prefix(source: Path, dtype: torch.dtype) -> str:
    """What every kept file of the checkpoint at this path in `dtype` is named with first."""
    return f"{source.stem}-{hashlib.sha256(f'{source.resolve()} {dtype}'.encode()).hexdigest()[:8]}-"


def _key(source: Path, dtype: torch.dtype) -> str:
    stat = source.stat()
    digest = hashlib.sha256(json.dumps({"format": FORMAT, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                                        "dtype": str(dtype)}).encode())
    here = Path(__file__).parent
    for name in LOADER_SOURCES:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:20]


def _mapped(index_path: Path, data_path: Path) -> State | None:
    """The kept state, its tensors views of the mapped file; None where none is kept whole."""
    try:
        index = json.loads(index_path.read_text())
        size = data_path.stat().st_size
    except OSError:
        return None
    except ValueError as exc:
        log.warning("assembling the weights again: %s is unreadable: %s", index_path, exc)
        return None
    if size != index.get("nbytes") or size == 0:
        log.warning("assembling the weights again: %s holds %d bytes, its index %s", data_path, size,
                    index.get("nbytes"))
        return None
    flat = torch.from_file(str(data_path), shared=False, size=size, dtype=torch.uint8)
    state = {}
    for name, entry in index["tensors"].items():
        dtype = getattr(torch, entry["dtype"])
        nbytes = math.prod(entry["shape"]) * dtype.itemsize
        state[name] = flat[entry["offset"]:entry["offset"] + nbytes].view(dtype).view(entry["shape"])
    return state


def _keep(state: State, index_path: Path, data_path: Path) -> bool:
    """Writes `state`, then its index; False where it cannot be kept."""
    tensors: dict[str, dict] = {}
    written = {"nbytes": 0}

    def write_data(f) -> None:
        offset = 0
        for name, tensor in state.items():
            offset += _pad(f, offset)
            data = tensor.detach().cpu().contiguous()
            tensors[name] = {"offset": offset, "shape": list(data.shape),
                             "dtype": str(data.dtype).removeprefix("torch.")}
            f.write(data.view(torch.uint8).reshape(-1).numpy().data)
            offset += data.numel() * data.element_size()
        written["nbytes"] = offset

    try:
        keep_file(data_path, write_data, binary=True)
        nbytes = written["nbytes"]
        keep_file(index_path, lambda f: json.dump({"nbytes": nbytes, "tensors": tensors}, f))
    except OSError as exc:
        log.warning("the assembled weights are not kept (%s): %s", index_path.parent, exc)
        return False
    log.info("kept the assembled weights (%.0f MB) in %s", nbytes / 1e6, data_path)
    return True


def _remove_stale(folder: Path, prefix: str, keep: set[str]) -> None:
    """The files kept before of the same checkpoint path (another version of the file, another
    loader; a process that maps one keeps its pages: unlinking leaves a mapping whole)."""
    for path in folder.glob(f"{prefix}*"):
        if path.name not in keep and path.suffix in (".bin", ".json"):
            path.unlink(missing_ok=True)


def _pad(f, offset: int) -> int:
    padding = -offset % ALIGN
    f.write(b"\0" * padding)
    return padding
