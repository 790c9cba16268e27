"""Production behaviour: mutual TLS and tokens, workers joining and leaving, drain on SIGTERM."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers.streams import stream
from pdserve.cli.supervisor import Supervisor
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from tests.helpers.cluster import cluster_flags
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
ENGINE = ["--threads", "1", "--kv-blocks", "192", "--host-kv-blocks", "64", "--token-budget", "256",
          "--max-chunk-tokens", "128"]
ENV = {**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n"}


def _request(text: str, max_tokens: int = 12) -> pb.GenerateRequest:
    return pb.GenerateRequest(text=text, sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0,
                                                                    ignore_eos=True))


def _wait_health(channel: grpc.Channel, timeout_s: float = 120.0) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    raise AssertionError("not SERVING in time")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pki") / "out"
    subprocess.run(["bash", str(REPO / "deploy/k8s/secrets/generate.sh"), str(out), "pdserve", "2"], check=True,
                   capture_output=True, timeout=120)
    return out


def test_mutual_tls_and_tokens(pki):
    tls = ["--tls-cert", str(pki / "tls.crt"), "--tls-key", str(pki / "tls.key"), "--tls-ca", str(pki / "ca.crt"),
           "--cluster-token-file", str(pki / "cluster-token")]
    sup = Supervisor(env=ENV)
    try:
        decode = sup.spawn("decode", ["decode", "--port", "0", "--advertise-host", "localhost", *ENGINE, *tls])
        prefill = sup.spawn("prefill", ["prefill", "--port", "0", *ENGINE, *tls])
        d, p = sup.wait_ready(decode, 300), sup.wait_ready(prefill, 300)
        router = sup.spawn("router", ["router", "--port", "0", "--health-port", "0", "--prefill-workers",
                                      f"localhost:{p}", "--decode-workers", f"localhost:{d}", *tls,
                                      "--api-token-file", str(pki / "api-token")])
        port = sup.wait_ready(router, 300)
        creds = grpc.ssl_channel_credentials((pki / "ca.crt").read_bytes(), (pki / "client.key").read_bytes(),
                                             (pki / "client.crt").read_bytes())
        token = [("authorization", f"Bearer {(pki / 'api-token').read_text().strip()}")]
        with grpc.secure_channel(f"localhost:{port}", creds) as channel:
            _wait_health(channel)
            stub = generation_pb2_grpc.GenerationStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Generate(_request("Hello"), timeout=60))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            messages = list(stub.Generate(_request("Hello"), metadata=token, timeout=300))
            assert sum(len(m.token_ids) for m in messages) == 12
        with grpc.secure_channel(f"localhost:{d}", creds) as channel:
            with pytest.raises(grpc.RpcError) as err:
                worker_pb2_grpc.DecodeWorkerStub(channel).Abort(wpb.WorkerAbortRequest(request_id="x"), timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(f"localhost:{port}") as plain:
            with pytest.raises(grpc.RpcError) as err:
                list(generation_pb2_grpc.GenerationStub(plain).Generate(_request("Hello"), metadata=token, timeout=10))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        sup.stop()


def test_workers_join_by_registering_and_leave_by_draining_without_failures():
    sup = Supervisor(env=ENV)
    secured = cluster_flags(sup.workdir)
    try:
        router = sup.spawn("router", ["router", "--port", "0", "--internal-port", "0", *secured])
        target = f"127.0.0.1:{sup.wait_ready(router, 300)}"
        registry = f"127.0.0.1:{json.loads(router.ready_file.read_text())['internal_port']}"
        join = ["--register-with", registry, "--drain-timeout-s", "120", *ENGINE, *secured]
        first = [sup.spawn(n, [n.split("-")[0], "--port", "0", *join]) for n in ("prefill-0", "decode-0")]
        for child in first:
            sup.wait_ready(child, 300)
        with grpc.insecure_channel(target) as channel:
            _wait_health(channel)
            stub = generation_pb2_grpc.GenerationStub(channel)
            assert len(stream(stub, _request("First"), timeout=300).token_ids) == 12
            late = sup.spawn("decode-1", ["decode", "--port", "0", *join])
            sup.wait_ready(late, 300)
            _wait_in_rotation(stub, late)
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                futures = [pool.submit(stream, stub, _request(f"Question {i}", 24), None, 600) for i in range(4)]
                _wait_served(late)
                os.killpg(first[1].process.pid, signal.SIGTERM)
                results = [f.result() for f in futures]
            assert all(len(r.token_ids) == 24 for r in results)
            assert first[1].process.wait(180) == 0
            after = stream(stub, _request("After the drain"), timeout=300)
            assert len(after.token_ids) == 12
    finally:
        sup.stop()


def _wait_in_rotation(stub, late, timeout_s: float = 300.0) -> None:
    """Probes, two at a time, until the late worker holds one: the router discovered it and
    polled it (of two requests in flight, placement gives the second to the idle worker)."""
    with grpc.insecure_channel(f"127.0.0.1:{late.port}") as channel:
        stats = worker_pb2_grpc.DecodeWorkerStub(channel).Stats

        def busy() -> bool:
            s = stats(wpb.StatsRequest(), timeout=10)
            return s.requests_running + s.requests_waiting > 0 or s.blocks_active > 0

        def a_probe_lands_there() -> bool:
            seen = False
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                probes = [pool.submit(stream, stub, _request(f"Probe {i}", 16), None, 300) for i in range(2)]
                while not seen and concurrent.futures.wait(probes, timeout=0.05).not_done:
                    seen = busy()
                for probe in probes:
                    assert len(probe.result().token_ids) == 16
            return seen

        wait_until(a_probe_lands_there, timeout_s, "the late decode worker in the router's rotation", interval_s=0)


def _wait_served(child, timeout_s: float = 300.0) -> None:
    """Until the late worker holds a request: it was discovered and is used."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(f"127.0.0.1:{child.port}") as channel:
        stub = worker_pb2_grpc.DecodeWorkerStub(channel)
        while time.monotonic() < deadline:
            stats = stub.Stats(wpb.StatsRequest(), timeout=10)
            if stats.requests_running + stats.requests_waiting > 0 or stats.blocks_active > 0:
                return
            time.sleep(0.1)
    raise AssertionError("the worker that joined late was never used")
