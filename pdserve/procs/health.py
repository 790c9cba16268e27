"""Asks a gRPC server whether it is SERVING (its overall health, service ""): the one way the CLI,
the chaos fleets, the benchmarks and the tests do.

    answers_serving(target, 10, credentials)   one check; the RpcError where nothing answers
    serving(target)                            one check; False where nothing answers
    wait_serving(target, 60)                   until SERVING; TimeoutError after 60 s

A channel is plaintext unless `credentials` are given (TLS, with `options` such as
`grpc.ssl_target_name_override`). grpc is imported on the first call, not with this module.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

ChannelOptions = Sequence[tuple[str, str | int]]


def _channel(target: str, credentials: grpc.ChannelCredentials | None, options: ChannelOptions) -> grpc.Channel:
    import grpc

    if credentials is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, credentials, options=options)


def _is_serving(channel: grpc.Channel, timeout_s: float) -> bool:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def answers_serving(target: str, timeout_s: float, credentials: grpc.ChannelCredentials | None = None,
                    options: ChannelOptions = ()) -> bool:
    """One health check: True when `target` answers SERVING, False for any other status; raises
    the grpc.RpcError where it does not answer within `timeout_s`."""
    with _channel(target, credentials, options) as channel:
        return _is_serving(channel, timeout_s)


def serving(target: str, timeout_s: float = 1.0, credentials: grpc.ChannelCredentials | None = None,
            options: ChannelOptions = ()) -> bool:
    """One health check: True when `target` answers SERVING within `timeout_s`, else False."""
    import grpc

    try:
        return answers_serving(target, timeout_s, credentials, options)
    except grpc.RpcError:
        return False


def wait_serving(target: str, timeout_s: float, credentials: grpc.ChannelCredentials | None = None,
                 options: ChannelOptions = (), check_timeout_s: float = 2.0, interval_s: float = 0.2) -> None:
    """Return once `target` answers SERVING, checked on one channel every `interval_s` (each check
    given `check_timeout_s`); TimeoutError after `timeout_s`."""
    import grpc

    deadline = time.monotonic() + timeout_s
    with _channel(target, credentials, options) as channel:
        while time.monotonic() < deadline:
            try:
                if _is_serving(channel, check_timeout_s):
                    return
            except grpc.RpcError:
                pass
            time.sleep(interval_s)
    raise TimeoutError(f"{target} not SERVING after {timeout_s:.0f} s")
