"""One real fleet per fuzz module; a process that died in one test is started again for the next."""

from __future__ import annotations

import grpc
import pytest

from tests.fuzz.fleet import FuzzFleet, start_fleet, supervisor, wait_back


@pytest.fixture(scope="module")
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
    """One channel per process, by role."""
    opened = {"router": grpc.insecure_channel(live_fleet.router), "prefill": grpc.insecure_channel(live_fleet.prefill),
              "decode": grpc.insecure_channel(live_fleet.decode)}
    try:
        yield opened
    finally:
        for channel in opened.values():
            channel.close()
