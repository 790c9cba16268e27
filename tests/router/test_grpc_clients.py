"""Status codes and trailing metadata of failed worker calls, as WorkerFaults."""

from __future__ import annotations

import grpc
import pytest

from router.fleet.clients import Culprit, FaultKind
from pdserve.rpc.errors import FAULT_METADATA
from router.fleet.grpc_wire import fault_of


def _error(code: grpc.StatusCode, trailing=()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), "details")


@pytest.mark.parametrize("code,kind,culprit", [
    (grpc.StatusCode.UNAVAILABLE, FaultKind.GONE, Culprit.SELF),
    (grpc.StatusCode.CANCELLED, FaultKind.GONE, Culprit.SELF),
    (grpc.StatusCode.DEADLINE_EXCEEDED, FaultKind.TIMEOUT, Culprit.NOBODY),
    (grpc.StatusCode.INVALID_ARGUMENT, FaultKind.REFUSED, Culprit.SELF),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, FaultKind.OVERLOADED, Culprit.SELF),
    (grpc.StatusCode.INTERNAL, FaultKind.FAILED, Culprit.SELF),
    (grpc.StatusCode.UNKNOWN, FaultKind.FAILED, Culprit.SELF),
    (grpc.StatusCode.ALREADY_EXISTS, FaultKind.FAILED, Culprit.SELF),
    (grpc.StatusCode.ABORTED, FaultKind.ABORTED, Culprit.NOBODY),  # its client's Abort, through another router
])
def test_status_codes_map_to_fault_kinds(code, kind, culprit):
    fault = fault_of(_error(code), "w:1")
    assert (fault.kind, fault.culprit, fault.address) == (kind, culprit, "w:1")
    assert "w:1" in fault.message and code.name in fault.message


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INVALID_ARGUMENT])
def test_a_worker_naming_its_decode_peer_makes_the_fault_the_peers(code):
    fault = fault_of(_error(code, [(FAULT_METADATA, "decode")]), "p:1")
    assert (fault.kind, fault.culprit) == (FaultKind.GONE, Culprit.PEER)
