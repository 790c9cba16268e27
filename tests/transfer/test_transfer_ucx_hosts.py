"""UCX between hosts (network namespaces on one bridge) with the defaults: a sender takes the
network path (no shared memory) to a peer on another host and the host path to one beside it,
and a peer that cannot be reached fails the send within the connect time, no connection kept.
Both ends run as commands on test hosts (tests/transfer/transfer_peer.py)."""

import asyncio
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from pdserve.transfer.ucx import UcxTransport
from pdserve.transfer.ucx_paths import Path
from tests.helpers.hosts import test_hosts
from tests.transfer import transfer_peer
from tests.transfer.transfer_helpers import SECRET, make_pool, run

pytestmark = pytest.mark.timeout(120)

PLAN = [("req-a", 0, [(i, 31 - i) for i in range(8)]), ("req-b", 0, [(20, 0), (21, 1), (25, 2)])]
SEED = 5


@pytest.fixture(scope="module")
def hosts():
    with test_hosts(2) as net:
        yield net


def _start(host, *argv: str) -> subprocess.Popen:
    return subprocess.Popen([*host.launcher(), sys.executable, "-m", "tests.transfer.transfer_peer", *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n"})


@pytest.fixture
def ends(hosts, tmp_path):
    """send(connect_s): a receiver on host 0 expecting PLAN, a sender on host 1 sending it;
    the sender's report and the receiver's process and pool file."""
    started = []

    def send(connect_s: float = 5.0, before_send=lambda: None):
        receiver = _start(hosts.hosts[0], "receiver", str(tmp_path / "pool.npy"), "30", json.dumps(PLAN))
        sender = _start(hosts.hosts[1], "sender", str(SEED), "20", json.dumps(PLAN), str(connect_s))
        started.extend((receiver, sender))
        address = receiver.stdout.readline()
        before_send()
        report, _ = sender.communicate(address, timeout=90)
        last = [line for line in report.splitlines() if line.startswith("{")][-1]  # UCX may print too
        return json.loads(last), receiver, tmp_path / "pool.npy"

    yield send
    for process in started:
        process.kill()
        process.wait(10)


def test_kv_reaches_a_receiver_on_another_host_over_the_network_path(ends):
    report, receiver, pool = ends()
    assert [name for name, _ in report["outcomes"]] == ["TransferResult"] * 2, report
    assert report["paths"] == ["network"]
    assert json.loads(receiver.stdout.readline()) == ["TransferResult"] * 2
    torch.manual_seed(SEED)
    src, dst = make_pool(fill=True), torch.from_numpy(np.load(pool))
    for _, _, pairs in PLAN:
        for s, d in pairs:
            assert torch.equal(dst[d], src[s])


def test_a_receiver_beside_the_sender_is_reached_over_the_host_path():
    async def main():
        receiver = UcxTransport(transfer_peer.CONFIG).receiver(make_pool(fill=False))
        sender = UcxTransport(transfer_peer.CONFIG).sender(make_pool(fill=True))
        expect = asyncio.ensure_future(receiver.expect("t", 0, [(3, 4)], 10.0, secret=SECRET))
        await sender.send(receiver.address(), "t", 0, [(3, 4)], 10.0, secret=SECRET)
        await expect
        paths = dict(sender.paths)
        await sender.close()
        await receiver.close()
        return paths

    assert [p.path for p in run(main()).values()] == [Path.HOST]


def test_a_receiver_whose_host_drops_every_packet_fails_the_send_within_the_connect_time(hosts, ends):
    receiver_host = hosts.hosts[0]
    try:
        report, _, _ = ends(connect_s=2.0, before_send=lambda: hosts.blackhole(receiver_host))
    finally:
        hosts.clear(receiver_host)
    assert {name for name, _ in report["outcomes"]} == {"TransferUnreachable"}, report
    assert all("network path" in message for _, message in report["outcomes"])
    assert report["peers"] == 0  # no connection kept: a later send connects anew
