"""The decode kernel, built once a session with this machine's C compiler (into its usual cache)."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def native_decode():
    from pdserve.attention.native_decode import NativeDecode

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: torch-batched decodes by its sparse products")
    return NativeDecode.load()  # a compiler that fails to build it fails the test
