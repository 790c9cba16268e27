#!/usr/bin/env python3
"""pdserve-health: exit 0 when a grpc.health.v1 service reports SERVING, 1 otherwise.

    pdserve-health [--service NAME] [--timeout-s SECONDS] HOST:PORT

Plaintext only: it is meant for a process's --health-port, which serves nothing but
grpc.health.v1. docker compose health checks use it; Kubernetes uses its built-in gRPC probes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


@dataclass(frozen=True)
class Probe:
    """One health question: is `service` ("" = the whole server) at `address` SERVING?"""

    address: str
    service: str = ""
    timeout_s: float = 3.0


@dataclass(frozen=True)
class Verdict:
    healthy: bool
    detail: str


def check(probe: Probe) -> Verdict:
    """Ask once; an unreachable server or an unknown service is unhealthy, never an exception."""
    request = health_pb2.HealthCheckRequest(service=probe.service)
    with grpc.insecure_channel(probe.address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=probe.timeout_s)
        except grpc.RpcError as err:
            return Verdict(False, f"{err.code().name}: {err.details()}")
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return Verdict(reply.status == health_pb2.HealthCheckResponse.SERVING, status)


def parse_args(argv: Sequence[str]) -> Probe:
    parser = argparse.ArgumentParser(prog="pdserve-health", description=__doc__.splitlines()[0])
    parser.add_argument("address", help="HOST:PORT of a grpc.health.v1 server (plaintext)")
    parser.add_argument("--service", default="", help='health service name; "" = overall')
    parser.add_argument("--timeout-s", type=float, default=3.0, help="deadline of the check")
    args = parser.parse_args(argv)
    return Probe(address=args.address, service=args.service, timeout_s=args.timeout_s)


def main(argv: Sequence[str] | None = None) -> int:
    probe = parse_args(sys.argv[1:] if argv is None else argv)
    verdict = check(probe)
    print(f"{probe.address} [{probe.service or 'overall'}] {verdict.detail}")
    return 0 if verdict.healthy else 1


if __name__ == "__main__":
    sys.exit(main())
