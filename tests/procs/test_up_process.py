"""UpProcess: a whole `pdserve up` as one child; its router serves, and stopping it leaves no process behind."""

from __future__ import annotations

import json
import os

import pytest

from pdserve.client import Client, ClientOptions
from pdserve.procs.up_process import UpProcess
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

FLAGS = ["--port", "0", "--http-port", "-1", "--mode", "colocated", "--decode-workers", "1", "--kv-blocks", "128",
         "--host-kv-blocks", "64", "--token-budget", "256", "--drain-timeout-s", "5"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_serves_then_stops_with_every_child():
    env = {**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"}
    with UpProcess(FLAGS, env, ready_timeout_s=300) as up:
        with Client(up.router, ClientOptions(timeout_s=120)) as client:
            assert len(client.generate("Hello", max_tokens=4, ignore_eos=True).token_ids) == 4
        pids = [c["pid"] for c in json.loads(up.status_file.read_text())["children"]]
    assert up.process.returncode == 0  # drained and exited on SIGTERM
    wait_until(lambda: not any(_alive(p) for p in pids), 30, "every child of pdserve up gone")
