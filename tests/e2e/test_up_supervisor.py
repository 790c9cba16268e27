"""`pdserve up` as a supervisor, as a subprocess: a killed worker, a worker whose engine failed
and a killed router are restarted on the same port and serve again; a fault of one request
fails only that request; SIGTERM drains everything and exits 0.

The tests share one `pdserve up` and run in order (the last one stops it).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from pdserve.client import Client, ClientOptions, PdserveError
from pdserve.procs.health import wait_serving
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import worker_pb2, worker_pb2_grpc
from tests.helpers.worker_stats import STUBS, worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

FLAGS = ["--http-port", "0", "--prefill-workers", "1", "--decode-workers", "1", "--kv-blocks", "128",
         "--host-kv-blocks", "64",
         "--token-budget", "256", "--decode-failover", "fail", "--drain-timeout-s", "5"]


class Up:
    def __init__(self, tmp: Path):
        self.status_file = tmp / "status.json"
        self.faults = tmp / "fault-{pid}"
        env = {**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1",
               "PDSERVE_FAULT_INJECT_FILE": str(self.faults)}
        self.log = open(tmp / "up.log", "w")
        self.process = subprocess.Popen([sys.executable, "-m", "pdserve.cli.main", "up", "--port", "0", *FLAGS,
                                         "--status-file", str(self.status_file)],
                                        env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def status(self) -> dict:
        return json.loads(self.status_file.read_text()) if self.status_file.exists() else {"children": []}

    def child(self, name: str) -> dict:
        return next(c for c in self.status()["children"] if c["name"] == name)

    def internal_metadata(self) -> tuple[tuple[str, str], ...]:
        """The cluster token `pdserve up` gave its children, for calls straight to a worker."""
        token = Path(self.status()["cluster_token_file"]).read_text().strip()
        return (("authorization", f"Bearer {token}"),)

    def wait_until(self, check, timeout_s: float, what: str):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"pdserve up exited with {self.process.returncode} waiting for {what}")
            if value := check():
                return value
            time.sleep(0.2)
        raise AssertionError(f"no {what} after {timeout_s} s")

    def kill_all(self) -> None:
        pids = [c["pid"] for c in self.status()["children"]]
        for pid in [self.process.pid, *pids]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.process.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    fleet = Up(tmp_path_factory.mktemp("up"))
    try:
        router = fleet.wait_until(lambda: fleet.status().get("router"), 300, "router address")
        wait_serving(router, 120)
        yield fleet
    finally:
        fleet.kill_all()


GREEDY = {"temperature": 0, "ignore_eos": True}


def _generate(target: str) -> list[int]:
    with Client(target, ClientOptions(timeout_s=60)) as client:
        return client.generate("Name three colours.", max_tokens=8, **GREEDY).token_ids


def _serves_again(target: str) -> bool:
    try:
        return len(_generate(target)) == 8
    except PdserveError:
        return False


def _blocks_active(up: Up) -> dict[str, int]:
    return {c["name"]: worker_stats(f"127.0.0.1:{c['port']}", c["role"]).blocks_active
            for c in up.status()["children"] if c["role"] in STUBS}


def _all_blocks_free(up: Up) -> bool:
    return up.wait_until(lambda: set(_blocks_active(up).values()) == {0}, 30, "zero active blocks on every worker")


def _restarted(up: Up, name: str, before: dict) -> dict:
    """The child's next start, once it is serving again."""
    return up.wait_until(lambda: (c := up.child(name))["restarts"] > before["restarts"]
                         and c["state"] == "serving" and c, 180, f"restart of {name}")


def test_the_internal_plane_is_closed_by_a_token_of_its_own(up):
    token_file = Path(up.status()["cluster_token_file"])
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    with grpc.insecure_channel(f"127.0.0.1:{up.child('decode-0')['port']}") as channel:
        stub = worker_pb2_grpc.DecodeWorkerStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Decode(_local_decode("no-token", 2), timeout=30))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert len(_decoded_tokens(stub, "with-token", 2, up.internal_metadata())) == 2


def test_a_killed_decode_worker_is_restarted_on_its_port_and_serves(up):
    router = up.status()["router"]
    assert len(_generate(router)) == 8
    before = up.child("decode-0")
    os.kill(before["pid"], signal.SIGKILL)
    after = _restarted(up, "decode-0", before)
    assert after["pid"] != before["pid"]
    assert (after["port"], after["metrics_port"]) == (before["port"], before["metrics_port"])
    assert up.wait_until(lambda: _serves_again(router), 120, "a request served after the restart")
    assert _all_blocks_free(up)


def test_an_engine_failure_ends_the_stream_with_a_status_and_the_worker_comes_back(up):
    router = up.status()["router"]
    before = up.child("decode-0")
    with Client(router, ClientOptions(timeout_s=120)) as client:
        story = client.stream("Tell me a long story about a lighthouse.", max_tokens=400, **GREEDY)
        with pytest.raises(PdserveError) as ended:
            for i, _ in enumerate(story):
                if i == 2:
                    Path(str(up.faults).replace("{pid}", str(before["pid"]))).touch()
        # ended by the engine's failure, as the worker reported it (not by its deadline, nor by the
        # worker's exit cutting a stream that hung): what the stream's end says, not how soon it came
        assert ended.value.code == "UNAVAILABLE" and "injected engine fault" in ended.value.details, ended.value
    after = _restarted(up, "decode-0", before)
    assert after["port"] == before["port"]
    assert up.wait_until(lambda: _serves_again(router), 120, "a request served after the restart")
    assert _all_blocks_free(up)


def test_a_request_fault_fails_only_that_request_and_the_worker_stays(up):
    """Straight to the decode worker (local prefill), where request ids are the caller's."""
    before = up.child("decode-0")
    trigger = Path(str(up.faults).replace("{pid}", str(before["pid"])))
    with grpc.insecure_channel(f"127.0.0.1:{before['port']}") as channel, ThreadPoolExecutor(1) as pool:
        stub = worker_pb2_grpc.DecodeWorkerStub(channel)
        bystander = pool.submit(_decoded_tokens, stub, "ok-1", 40, up.internal_metadata())
        events = stub.Decode(_local_decode("rf-1", 400), metadata=up.internal_metadata(), timeout=120)
        with pytest.raises(grpc.RpcError) as ended:
            for i, _ in enumerate(events):
                if i == 2:
                    trigger.write_text("request rf-1")
        # ended by its own fault, as the worker reported it, not by its deadline
        assert ended.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED, ended.value
        assert "injected request fault" in ended.value.details(), ended.value
        assert len(bystander.result(120)) == 40
    assert up.child("decode-0")["pid"] == before["pid"] and not trigger.exists()
    assert _all_blocks_free(up)


def _local_decode(request_id: str, max_tokens: int) -> worker_pb2.DecodeRequest:
    sampling = pb.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    request = worker_pb2.WorkerRequest(request_id=request_id, prompt_token_ids=list(range(10, 40)),
                                       sampling=sampling, priority=pb.PRIORITY_NORMAL, kv_timeout_s=10)
    return worker_pb2.DecodeRequest(request=request, local_prefill=True)


def _decoded_tokens(stub, request_id: str, max_tokens: int, metadata) -> list[int]:
    events = stub.Decode(_local_decode(request_id, max_tokens), metadata=metadata, timeout=120)
    return [t for event in events if event.WhichOneof("event") == "tokens" for t in event.tokens.token_ids]


def test_a_killed_router_is_restarted_on_its_port(up):
    before = up.child("router")
    os.kill(before["pid"], signal.SIGKILL)
    after = _restarted(up, "router", before)
    assert after["port"] == before["port"] and up.status()["router"] == f"127.0.0.1:{before['port']}"
    assert up.wait_until(lambda: _serves_again(up.status()["router"]), 120, "a request served by the new router")


def test_sigterm_drains_every_child_and_exits_zero(up):
    pids = [c["pid"] for c in up.status()["children"]]
    up.process.send_signal(signal.SIGTERM)
    assert up.process.wait(60) == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
