"""The suite's processes share the tests by module (tests/conftest.py): a pytest that stops
honouring the groups would run two fleets at once and outgrow the machine's memory, so it fails
here first."""

from __future__ import annotations

import os


def test_each_test_is_grouped_with_its_module_and_xdist_honours_the_group(request):
    assert request.node.get_closest_marker("xdist_group").args == ("tests/test_xdist_groups.py",)
    if "PYTEST_XDIST_WORKER" in os.environ:  # make test TEST_PROCESSES=2
        assert request.node.nodeid.endswith("@tests/test_xdist_groups.py"), request.node.nodeid
