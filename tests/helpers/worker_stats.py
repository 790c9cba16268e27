"""The workers' own count of what they hold (their Stats RPC, no token needed), and waiting for it
to reach zero."""

from __future__ import annotations

import grpc

from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from tests.helpers.waiting import WaitTimeout, wait_until

STUBS = {"decode": worker_pb2_grpc.DecodeWorkerStub, "prefill": worker_pb2_grpc.PrefillWorkerStub}


def worker_stats(address: str, role: str) -> wpb.WorkerStats:
    """One worker's Stats; `role` is "decode" or "prefill"."""
    with grpc.insecure_channel(address) as channel:
        return STUBS[role](channel).Stats(wpb.StatsRequest(), timeout=10)


def active_blocks(service: dict) -> dict[str, int]:
    """Blocks in use on the service's decode and prefill workers (`service[role]`: an address)."""
    return {role: worker_stats(service[role], role).blocks_active for role in ("decode", "prefill")}


def wait_no_active_blocks(service: dict, timeout_s: float = 30.0) -> None:
    try:
        wait_until(lambda: active_blocks(service) == {"decode": 0, "prefill": 0}, timeout_s,
                   "zero active blocks on the decode and the prefill worker")
    except WaitTimeout as timeout:
        raise WaitTimeout(f"{timeout}; still active: {active_blocks(service)}") from None
