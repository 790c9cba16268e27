"""The health probe: SERVING or not, no answer as False (or the RpcError), and the wait until SERVING."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pdserve.procs.health import answers_serving, serving, wait_serving

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


@contextmanager
def health_server(status: int) -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", status)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(grace=None)


def unused_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_serving_server_is_serving_and_a_not_serving_one_is_not():
    with health_server(SERVING) as (address, _):
        assert serving(address) and answers_serving(address, 5)
    with health_server(NOT_SERVING) as (address, _):
        assert not serving(address) and not answers_serving(address, 5)


def test_no_answer_is_false_or_the_rpc_error_and_the_wait_times_out():
    address = unused_address()
    assert not serving(address, 0.5)
    with pytest.raises(grpc.RpcError):
        answers_serving(address, 0.5)
    with pytest.raises(TimeoutError, match="not SERVING"):
        wait_serving(address, 0.5, check_timeout_s=0.2)


def test_the_wait_returns_once_the_server_turns_serving():
    with health_server(NOT_SERVING) as (address, servicer):
        threading.Timer(0.5, servicer.set, ("", SERVING)).start()
        wait_serving(address, 10)
        assert serving(address)
