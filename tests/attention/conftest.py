"""The decode kernel, built once a session with this machine's C compiler (into its usual cache).
No compiler fails the tests that need it, with what to install: the service would still run (on
the sparse products), but the suite must not pass without testing the path it serves."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def native_decode():
    from tests.helpers.kernels import decode_kernel

    return decode_kernel()
