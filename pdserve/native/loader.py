"""The one way a wrapper of this folder loads its C library, and the one rule for doing without.

    loaded = load_kernel(PAGED_DECODE, NativeDecode)   # Loaded(kernel, None), or Loaded(None, why)

A kernel that cannot be built or loaded here (no compiler, a compile error, an unwritable cache),
or that a caller finds computing wrongly (`warn_fallback`), is logged once per process at WARNING
with the reason and what doing without costs, e.g.

    decode attention kernel unavailable (no C compiler ...): using the sparse products, slower decode

Every later fallback of that kernel in the process is silent; the caller keeps its slower path.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, NamedTuple, TypeVar

from pdserve.native.build import NativeBuildError, load_library

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kernel:
    """One C source of this folder, as its fallback names it."""

    source: str  # the file beside this one, e.g. "paged_decode.c"
    what: str  # e.g. "decode attention kernel"
    fallback: str  # what runs instead and what it costs, e.g. "using the sparse products, slower decode"

    @property
    def path(self) -> Path:
        return Path(__file__).with_name(self.source)


def every_source() -> list[Path]:
    """The C sources of this folder: what an image builds ahead (`pdserve kernels`)."""
    return sorted(Path(__file__).parent.glob("*.c"))


class Loaded(NamedTuple, Generic[T]):
    """A wrapped library, or None and why not."""

    kernel: T | None
    problem: str | None


def load_kernel(kernel: Kernel, wrap: Callable[[ctypes.CDLL], T]) -> Loaded[T]:
    """`kernel`'s library (built now unless cached) wrapped by `wrap`; where it cannot be built or
    loaded, Loaded(None, why), the fallback logged (`warn_fallback`)."""
    try:
        return Loaded(wrap(load_library(kernel.path)), None)
    except NativeBuildError as exc:
        warn_fallback(kernel, str(exc))
        return Loaded(None, str(exc))


def warn_fallback(kernel: Kernel, problem: str) -> None:
    """Logs that this process does without `kernel` because of `problem`: at WARNING, the first
    time for this kernel only."""
    if next(_fallbacks(kernel)) == 0:
        log.warning("%s unavailable (%s): %s", kernel.what, problem, kernel.fallback)


@functools.cache
def _fallbacks(kernel: Kernel) -> itertools.count:
    """How many fallbacks of `kernel` this process has met."""
    return itertools.count()
