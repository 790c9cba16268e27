"""Production behaviour: mutual TLS and tokens, workers joining and leaving, drain on SIGTERM."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import signal
import subprocess
from pathlib import Path

import grpc
import pytest

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions, PdserveError
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from tests.helpers.cluster import cluster_flags
from tests.helpers.waiting import wait_until
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
ENGINE = ["--threads", "1", "--kv-blocks", "192", "--host-kv-blocks", "64", "--token-budget", "256",
          "--max-chunk-tokens", "128"]
ENV = {**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n"}


GREEDY = {"temperature": 0, "ignore_eos": True}
HELD_TOKENS = 96  # a request the test must find on a worker runs this many decode steps, however fast it decodes


def _wait_health(client: Client, timeout_s: float = 120.0) -> None:
    wait_until(client.health, timeout_s, "the router SERVING")


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
        mtls = ClientOptions(tls_ca=str(pki / "ca.crt"), tls_cert=str(pki / "client.crt"),
                             tls_key=str(pki / "client.key"), timeout_s=300)
        token = (pki / "api-token").read_text().strip()
        with Client(f"localhost:{port}", mtls) as anonymous:
            _wait_health(anonymous)
            with pytest.raises(PdserveError) as err:
                anonymous.generate("Hello", max_tokens=12, **GREEDY)
            assert err.value.code == "UNAUTHENTICATED"
        with Client(f"localhost:{port}", dataclasses.replace(mtls, token=token)) as tenant:
            assert len(tenant.generate("Hello", max_tokens=12, **GREEDY).token_ids) == 12
        creds = grpc.ssl_channel_credentials((pki / "ca.crt").read_bytes(), (pki / "client.key").read_bytes(),
                                             (pki / "client.crt").read_bytes())
        with grpc.secure_channel(f"localhost:{d}", creds) as channel:
            with pytest.raises(grpc.RpcError) as err:
                worker_pb2_grpc.DecodeWorkerStub(channel).Abort(wpb.WorkerAbortRequest(request_id="x"), timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with Client(f"localhost:{port}", ClientOptions(token=token, timeout_s=10)) as plain:
            with pytest.raises(PdserveError) as err:
                plain.generate("Hello", max_tokens=12, **GREEDY)
            assert err.value.code == "UNAVAILABLE"
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
        with Client(target, ClientOptions(timeout_s=600)) as client:
            _wait_health(client)
            assert len(client.generate("First", max_tokens=12, **GREEDY).token_ids) == 12
            late = sup.spawn("decode-1", ["decode", "--port", "0", *join])
            sup.wait_ready(late, 300)
            _wait_in_rotation(client, late)
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                futures = [pool.submit(client.generate, f"Question {i}", max_tokens=HELD_TOKENS, **GREEDY)
                           for i in range(4)]
                _wait_served(late)
                os.killpg(first[1].process.pid, signal.SIGTERM)
                results = [f.result() for f in futures]
            assert all(len(r.token_ids) == HELD_TOKENS for r in results)
            assert first[1].process.wait(180) == 0
            assert len(client.generate("After the drain", max_tokens=12, **GREEDY).token_ids) == 12
    finally:
        sup.stop()


def _wait_in_rotation(client: Client, late, timeout_s: float = 300.0) -> None:
    """Probes, two at a time, until the late worker holds one: the router discovered it and
    polled it (of two requests in flight, placement gives the second to the idle worker)."""

    def a_probe_lands_there() -> bool:
        seen = False
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            probes = [pool.submit(client.generate, f"Probe {i}", max_tokens=HELD_TOKENS, **GREEDY) for i in range(2)]
            while not seen and concurrent.futures.wait(probes, timeout=0.05).not_done:
                seen = _busy(late)
            for probe in probes:
                assert len(probe.result().token_ids) == HELD_TOKENS
        return seen

    wait_until(a_probe_lands_there, timeout_s, "the late decode worker in the router's rotation", interval_s=0)


def _busy(decode) -> bool:
    s = worker_stats(f"127.0.0.1:{decode.port}", "decode")
    return s.requests_running + s.requests_waiting > 0 or s.blocks_active > 0


def _wait_served(child, timeout_s: float = 300.0) -> None:
    """Until the late worker holds a request: it was discovered and is used."""
    wait_until(lambda: _busy(child), timeout_s, "the worker that joined late holding a request")
