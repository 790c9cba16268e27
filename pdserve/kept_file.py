"""A file kept in a cache folder that several processes may fill at once: written whole to a
scratch file beside it, then linked into place unless another process linked its copy first (the
first writer wins; a kept file is never replaced, so a reader never sees one half written)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def keep_file(path: Path, write: Callable[[IO[Any]], None], binary: bool = False) -> None:
    """`write(f)` into a scratch file linked to `path` where nothing is there yet. Raises OSError
    where the folder cannot be made or written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-")
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        try:
            os.link(scratch, path)  # fails where another process linked its copy first
        except FileExistsError:
            pass
    finally:
        os.unlink(scratch)
