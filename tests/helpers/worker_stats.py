"""The workers' own count of blocks in use (their Stats RPC), and waiting for it to reach zero."""

from __future__ import annotations

import time

import grpc

from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc


def active_blocks(service: dict) -> dict[str, int]:
    out = {}
    for role, stub_cls in (("decode", worker_pb2_grpc.DecodeWorkerStub), ("prefill", worker_pb2_grpc.PrefillWorkerStub)):
        with grpc.insecure_channel(service[role]) as ch:
            out[role] = stub_cls(ch).Stats(wpb.StatsRequest(), timeout=5).blocks_active
    return out


def wait_no_active_blocks(service: dict, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        active = active_blocks(service)
        if all(a == 0 for a in active.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert active == {"decode": 0, "prefill": 0}
