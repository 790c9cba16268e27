"""Bearer tokens on unary and streaming calls, both directions of the interceptors; a service
refuses to start with its internal plane open unless told --insecure."""

from __future__ import annotations

import argparse
import asyncio
import stat

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pdserve.rpc.channels import ChannelPool
from pdserve.rpc.security import OPEN_METHODS, Security, TokenGuard, security_from_args, write_cluster_token

pytestmark = pytest.mark.timeout(60)
TRACE = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)


async def _calls(pool: ChannelPool, port: int) -> tuple:
    stub = health_pb2_grpc.HealthStub(pool.get(f"127.0.0.1:{port}"))
    results = []
    try:
        results.append((await stub.Check(health_pb2.HealthCheckRequest(), metadata=TRACE, timeout=5)).status)
    except grpc.aio.AioRpcError as exc:
        results.append(exc.code())
    call = stub.Watch(health_pb2.HealthCheckRequest(), metadata=TRACE, timeout=5)
    try:
        async for message in call:
            results.append(message.status)
            break
    except grpc.aio.AioRpcError as exc:
        results.append(exc.code())
    call.cancel()
    await pool.close()
    return tuple(results)


async def _run(client: Security) -> tuple:
    server = grpc.aio.server(interceptors=[TokenGuard(("/grpc.health.v1.Health/",), ("other", "sekret"))])
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        return await _calls(ChannelPool(client), port)
    finally:
        await server.stop(0)


def test_the_cluster_token_reaches_unary_and_streaming_calls():
    serving = health_pb2.HealthCheckResponse.SERVING
    assert asyncio.run(_run(Security(cluster_token="sekret"))) == (serving, serving)


@pytest.mark.parametrize("token", [None, "wrong"])
def test_missing_or_wrong_token_is_unauthenticated(token):
    refused = grpc.StatusCode.UNAUTHENTICATED
    assert asyncio.run(_run(Security(cluster_token=token))) == (refused, refused)


def test_plaintext_without_certificates_and_tls_with_them():
    assert Security().server_credentials() is None and Security().channel_credentials() is None
    assert Security(ca=b"x").channel_options() == () and Security(server_name="n").channel_options()


async def _health_calls_with_check_exempt() -> tuple:
    guard = TokenGuard(("/grpc.health.v1.Health/",), ("sekret-sekret-sekret",),
                       exempt=("/grpc.health.v1.Health/Check",))
    server = grpc.aio.server(interceptors=[guard])
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        return await _calls(ChannelPool(Security()), port)
    finally:
        await server.stop(0)


def test_exempt_methods_stay_open_while_the_rest_of_the_service_is_guarded():
    result = asyncio.run(_health_calls_with_check_exempt())
    assert result == (health_pb2.HealthCheckResponse.SERVING, grpc.StatusCode.UNAUTHENTICATED)


def test_only_the_workers_stats_are_exempt_on_the_internal_plane():
    guards = Security(cluster_token="c" * 16).server_interceptors()
    assert [set(g.exempt) for g in guards] == [set(OPEN_METHODS)]
    assert all(m.endswith("/Stats") for m in OPEN_METHODS)
    assert "/pdserve.v1.Registry/" in guards[0].prefixes


def _args(**flags) -> argparse.Namespace:
    return argparse.Namespace(role="decode", insecure=False, **flags)


def test_a_service_without_token_or_mutual_tls_refuses_to_start_unless_insecure():
    with pytest.raises(SystemExit, match="internal plane open.*--cluster-token-file.*--insecure"):
        security_from_args(_args())
    assert not security_from_args(argparse.Namespace(role="decode", insecure=True)).closed


def test_a_token_file_or_mutual_tls_closes_the_internal_plane(tmp_path):
    token = write_cluster_token(tmp_path / "cluster-token")
    assert security_from_args(_args(cluster_token_file=str(token))).closed
    for name in ("cert", "key", "ca"):
        (tmp_path / name).write_bytes(b"pem")
    mtls = {f"tls_{n}": str(tmp_path / n) for n in ("cert", "key", "ca")}
    assert security_from_args(_args(**mtls)).closed
    with pytest.raises(SystemExit, match="internal plane open"):  # TLS without client certificates
        security_from_args(_args(tls_cert=mtls["tls_cert"], tls_key=mtls["tls_key"]))


def test_a_short_token_is_refused(tmp_path):
    (tmp_path / "t").write_text("short\n")
    with pytest.raises(SystemExit, match="fewer than 16"):
        security_from_args(_args(cluster_token_file=str(tmp_path / "t")))


def test_a_written_cluster_token_is_random_and_readable_by_its_owner_only(tmp_path):
    a, b = write_cluster_token(tmp_path / "a"), write_cluster_token(tmp_path / "b")
    assert stat.S_IMODE(a.stat().st_mode) == 0o600
    assert len(a.read_text()) == 64 and a.read_text() != b.read_text()
