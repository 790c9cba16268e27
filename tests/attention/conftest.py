"""The decode kernel, built once a session with this machine's C compiler (into its usual cache).
No compiler fails the tests that need it, with what to install: the service would still run (on
the sparse products), but the suite must not pass without testing the path it serves."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def native_decode():
    from pdserve.attention.native_build import NativeBuildError
    from pdserve.attention.native_decode import NativeDecode

    try:
        return NativeDecode.load()
    except NativeBuildError as exc:
        pytest.fail(f"the decode kernel cannot be built here ({exc}); install a C compiler (gcc) or set CC")
