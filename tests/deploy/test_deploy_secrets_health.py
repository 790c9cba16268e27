"""The compose health check script, and the secrets generator's certificates under real gRPC mTLS."""

from __future__ import annotations

import base64
import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path

import grpc
import kubernetes_validate
import pytest
import yaml
from deploy_contract import GENERATED_SECRET_KEYS
from deploy_paths import DOCKER, K8S
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pdserve.procs.health import answers_serving

HEALTHCHECK = DOCKER / "healthcheck.py"
GENERATOR = K8S / "secrets" / "generate.sh"
NAMESPACE = "pdserve-test"
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def load_healthcheck():
    spec = importlib.util.spec_from_file_location("pdserve_healthcheck", HEALTHCHECK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


@contextmanager
def health_server(credentials: grpc.ServerCredentials | None = None) -> Iterator[str]:
    """A grpc.health.v1 server on 127.0.0.1: '' and 'liveness' SERVING, the API NOT_SERVING."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", SERVING)
    servicer.set("liveness", SERVING)
    servicer.set("pdserve.v1.Generation", NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = (
        server.add_secure_port("127.0.0.1:0", credentials) if credentials else server.add_insecure_port("127.0.0.1:0")
    )
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def test_healthcheck_exit_codes_follow_the_serving_status():
    healthcheck = load_healthcheck()
    with health_server() as address:
        assert healthcheck.main([address]) == 0
        assert healthcheck.main(["--service", "liveness", address]) == 0
        assert healthcheck.main(["--service", "pdserve.v1.Generation", address]) == 1
        assert healthcheck.main(["--service", "no.such.Service", address]) == 1
        assert healthcheck.check(healthcheck.Probe(address, "no.such.Service")).detail.startswith("NOT_FOUND")
    assert healthcheck.main(["--timeout-s", "0.5", address]) == 1


def test_healthcheck_runs_as_a_program():
    with health_server() as address:
        result = subprocess.run([sys.executable, str(HEALTHCHECK), address], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{address} [overall] SERVING"


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    if shutil.which("openssl") is None or shutil.which("bash") is None:
        pytest.skip("needs bash and openssl")
    out = tmp_path_factory.mktemp("secrets") / "out"
    result = subprocess.run(
        ["bash", str(GENERATOR), str(out), NAMESPACE, "2"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return out


def test_generated_secrets_validate_and_carry_the_referenced_keys(generated):
    secrets = [d for d in yaml.safe_load_all((generated / "secrets.yaml").read_text()) if d]
    for secret in secrets:
        kubernetes_validate.validate(secret, kubernetes_validate.latest_version(), strict=True)
    assert {s["metadata"]["name"]: frozenset(s["data"]) for s in secrets} == GENERATED_SECRET_KEYS
    assert {s["metadata"]["name"]: s["type"] for s in secrets} == {
        "pdserve-tls": "kubernetes.io/tls",
        "pdserve-tokens": "Opaque",
    }
    for secret in secrets:
        for key, value in secret["data"].items():
            assert base64.b64decode(value) == (generated / key).read_bytes()


def test_tokens_are_random_hex_and_keys_private(generated):
    tokens = [(generated / name).read_text() for name in ("cluster-token", "api-token")]
    assert all(len(t) == 64 and int(t, 16) >= 0 for t in tokens)
    assert tokens[0] != tokens[1]
    assert all((generated / key).stat().st_mode & 0o077 == 0 for key in ("ca.key", "tls.key", "client.key"))


def test_generator_refuses_to_overwrite(generated):
    before = (generated / "tls.key").read_bytes()
    result = subprocess.run(["bash", str(GENERATOR), str(generated)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "refusing" in result.stderr
    assert (generated / "tls.key").read_bytes() == before


def subject_alt_names(certificate: Path) -> list[str]:
    text = subprocess.run(
        ["openssl", "x509", "-in", str(certificate), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [name.strip().partition(":")[2] for name in text.splitlines()[1].split(",")]


def test_certificates_chain_to_the_ca_and_name_every_peer(generated, rendered):
    verify = subprocess.run(
        [
            "openssl",
            "verify",
            "-CAfile",
            str(generated / "ca.crt"),
            str(generated / "tls.crt"),
            str(generated / "client.crt"),
        ],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    names = subject_alt_names(generated / "tls.crt")
    config = next(m for m in rendered["base"] if m["metadata"]["name"] == "pdserve-config")["data"]
    peers = [
        config["PDSERVE_TLS_SERVER_NAME"],
        f"pdserve-router.{NAMESPACE}.svc",
        f"pdserve-prefill-0.pdserve-prefill.{NAMESPACE}.svc",
        f"pdserve-decode-3.pdserve-decode.{NAMESPACE}.svc",
    ]
    for peer in peers:
        assert any(fnmatch(peer, name) and peer.count(".") == name.count(".") for name in names), peer


def read(generated: Path, *names: str) -> list[bytes]:
    return [(generated / name).read_bytes() for name in names]


def serving_over_tls(address: str, credentials: grpc.ChannelCredentials) -> bool:
    return answers_serving(address, 10, credentials, options=[("grpc.ssl_target_name_override", "pdserve-internal")])


@pytest.mark.timeout(120)
def test_mutual_tls_accepts_cluster_and_client_certificates_and_rejects_anonymous(generated):
    ca, key, cert = read(generated, "ca.crt", "tls.key", "tls.crt")
    server_credentials = grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)
    with health_server(server_credentials) as address:
        for pair in (("tls.key", "tls.crt"), ("client.key", "client.crt")):
            client_key, client_cert = read(generated, *pair)
            credentials = grpc.ssl_channel_credentials(ca, private_key=client_key, certificate_chain=client_cert)
            assert serving_over_tls(address, credentials)
        with pytest.raises(grpc.RpcError) as refused:
            serving_over_tls(address, grpc.ssl_channel_credentials(ca))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
