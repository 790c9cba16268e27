"""SDK -> rotel-agent (a real OTLP collector) -> in-process receiver, attributes intact."""

import importlib.util
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from pdserve.telemetry import setup_tracing

ATTRIBUTES = {"pdserve.request_id": "r-9", "pdserve.tbt.p99": 0.041, "pdserve.preempted": True}


def _rotel_agent() -> Path | None:
    spec = importlib.util.find_spec("rotel")
    if spec is None or not spec.submodule_search_locations:
        return None
    binary = Path(spec.submodule_search_locations[0]) / "rotel-agent"
    return binary if os.access(binary, os.X_OK) else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"rotel-agent exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail("rotel-agent did not start listening")


@pytest.fixture
def rotel(grpc_receiver, tmp_path):
    binary = _rotel_agent()
    if binary is None:
        pytest.skip("rotel-agent not installed")
    grpc_port, http_port = _free_port(), _free_port()
    args = [
        str(binary), "start",
        "--otlp-grpc-endpoint", f"127.0.0.1:{grpc_port}",
        "--otlp-http-endpoint", f"127.0.0.1:{http_port}",
        "--pid-file", str(tmp_path / "rotel.pid"),
        "--log-file", str(tmp_path / "rotel.log"),
        "--exporter", "otlp",
        "--otlp-exporter-endpoint", grpc_receiver.endpoint,
        "--otlp-exporter-protocol", "grpc",
        "--traces-batch-timeout", "50ms",
    ]
    with open(tmp_path / "rotel.out", "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_listening(grpc_port, proc, timeout=15.0)
        yield f"http://127.0.0.1:{grpc_port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.mark.timeout(60)
def test_spans_cross_a_real_collector(rotel, grpc_receiver):
    tracing = setup_tracing("pdserve-decode", rotel, env={})
    with tracing.tracer().start_as_current_span("decode", attributes=ATTRIBUTES):
        pass
    tracing.shutdown()
    [span] = grpc_receiver.sink.wait_for(1, timeout=20.0)
    assert span.name == "decode"
    assert span.attributes == ATTRIBUTES
    assert span.resource["service.name"] == "pdserve-decode"
    assert span.resource["service.instance.id"] == tracing.instance_id
