"""The C kernels a test needs: built here, or the test fails saying what to install (the service
would still run on its slower paths, but the suite must not pass without testing the paths it serves)."""

from __future__ import annotations

from typing import TypeVar

import pytest

from pdserve.native.loader import Loaded
from pdserve.native.paged_decode import NativeDecode, load_native_decode

T = TypeVar("T")


def built(loaded: Loaded[T], what: str) -> T:
    """A native library's loader's result, or the test fails saying why it did not build here."""
    if loaded.kernel is None:
        pytest.fail(f"{what} cannot be built here ({loaded.problem}); install a C compiler (gcc) or set CC")
    return loaded.kernel


def decode_kernel() -> NativeDecode:
    """The decode attention kernel, built with this machine's C compiler (into its usual cache)."""
    return built(load_native_decode(), "the decode kernel")
