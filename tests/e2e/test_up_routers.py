"""`pdserve up --routers 2` on a tiny model: two routers in front of the same workers, each on ports of
its own, both printed and in the status file; each serves, and an Abort sent to one ends a stream
the other runs, after which no worker holds a block."""

from __future__ import annotations

import json
import os
import re

import pytest

from pdserve.client import Client, ClientOptions
from pdserve.procs.health import serving
from pdserve.procs.up_process import UpProcess
from tests.helpers.waiting import wait_until
from tests.helpers.worker_stats import STUBS, worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(600)]

HELD_TOKENS = 1000  # a stream still running when the test acts on it, at any decode speed
FLAGS = ["--routers", "2", "--port", "0", "--http-port", "0", "--kv-blocks", "128", "--host-kv-blocks", "16",
         "--token-budget", "256", "--drain-timeout-s", "5"]
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    from tests.helpers.tiny_models import tiny_qwen2_bias

    model = tiny_qwen2_bias(tmp_path_factory.mktemp("up") / "qwen2", max_positions=1024)
    env = {**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"}
    with UpProcess(["--model", str(model), *FLAGS], env, ready_timeout_s=300, stop_grace_s=60) as fleet:
        yield fleet


def _routers(up: UpProcess) -> list[dict]:
    return json.loads(up.status_file.read_text())["routers"]


def test_up_starts_each_router_on_ports_of_its_own_and_prints_them(up):
    routers = _routers(up)
    assert [r["name"] for r in routers] == ["router-0", "router-1"]
    assert len({r["grpc"] for r in routers}) == 2 and len({r["http"] for r in routers}) == 2
    printed = up.log.read_text()
    for router in routers:
        assert re.search(rf"{router['name']}: grpc {router['grpc']}", printed)
        assert f"{router['name']}: HTTP (OpenAI API) {router['http']}" in printed
        assert serving(router["grpc"])
        with Client(router["grpc"], ClientOptions(timeout_s=120)) as client:
            assert len(client.generate(token_ids=[5, 6, 7, 8], max_tokens=4, **GREEDY).token_ids) == 4


def test_an_abort_sent_to_one_router_ends_a_stream_the_other_runs(up):
    first, second = (r["grpc"] for r in _routers(up))
    with Client(first, ClientOptions(timeout_s=120)) as a, Client(second, ClientOptions(timeout_s=120)) as b:
        stream = a.stream(token_ids=[9, 10, 11], max_tokens=HELD_TOKENS, request_id="up-long", **GREEDY)
        head = next(stream)
        assert b.abort_outcome("up-long") == "aborted"
        rest = stream.collect()
    assert rest.finish_reason == "abort" and len(head.token_ids) + len(rest.token_ids) < HELD_TOKENS
    workers = [c for c in json.loads(up.status_file.read_text())["children"] if c["role"] in STUBS]
    wait_until(lambda: {worker_stats(f"127.0.0.1:{c['port']}", c["role"]).blocks_active for c in workers} == {0}, 30,
               "zero active blocks on every worker")
