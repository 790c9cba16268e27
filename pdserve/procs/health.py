"""Waits until a router answers its gRPC health check SERVING."""

from __future__ import annotations

import time


def wait_serving(target: str, timeout_s: float) -> None:
    """Return once `target`'s overall health is SERVING; TimeoutError after `timeout_s`."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise TimeoutError(f"router at {target} not SERVING after {timeout_s:.0f} s")
