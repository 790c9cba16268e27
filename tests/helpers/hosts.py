"""Test hosts (network namespaces on a bridge) for tests that cross a network: skipped, with the
reason, where this machine cannot make them (not root, no iproute2)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pdserve.procs.hosts import HostNetwork


@contextmanager
def test_hosts(count: int) -> Iterator[HostNetwork]:
    why = HostNetwork.unavailable()
    if why is not None:
        pytest.skip(f"no test hosts here: {why}")
    with HostNetwork.make(count) as net:
        yield net


test_hosts.__test__ = False  # a helper, not a test
