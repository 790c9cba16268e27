"""The suite's processes share the tests by module (tests/conftest.py): a pytest that stops
honouring the groups would run two fleets at once and outgrow the machine's memory, so it fails
here first."""

from __future__ import annotations

import os

import pytest


def test_under_xdist_each_test_runs_in_its_modules_group(request):
    if "PYTEST_XDIST_WORKER" not in os.environ:
        pytest.skip("not under pytest-xdist (make test runs it)")
    assert request.node.nodeid.endswith("@tests/test_xdist_groups.py"), request.node.nodeid
