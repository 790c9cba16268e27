"""One real fleet for all the fuzz tests; a process that died in one test is started again for the next."""

from __future__ import annotations

import grpc
import pytest

from tests.fuzz.fleet import ROLES, FuzzFleet, start_fleet, supervisor, wait_back


@pytest.fixture(scope="package")
def fleet():
    sup = supervisor()
    try:
        yield start_fleet(sup)
    finally:
        sup.stop()


@pytest.fixture()
def live_fleet(fleet: FuzzFleet) -> FuzzFleet:
    """The fleet with every process running (one that died in an earlier test restarted)."""
    wait_back(fleet)
    return fleet


@pytest.fixture()
def channels(live_fleet: FuzzFleet):
    """One channel per port, by role."""
    opened = {role: grpc.insecure_channel(live_fleet.address(role)) for role in ROLES}
    try:
        yield opened
    finally:
        for channel in opened.values():
            channel.close()
