"""Leases on the workers, end to end: client deadlines that cut requests anywhere in their life
leave nothing held on any worker, and a request whose first token ends it finishes."""

from __future__ import annotations

import concurrent.futures
import random
import time

import grpc
import pytest

from tests.helpers.streams import stream
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REQUESTS = 50
PROMPT_TOKENS = 1500


def _prompt(seed: int) -> pb.GenerateRequest:
    rng = random.Random(seed)
    ids = [rng.randrange(300, 40_000) for _ in range(PROMPT_TOKENS)]
    return pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids),
                              sampling=pb.SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))


def _status(stub, request: pb.GenerateRequest, timeout_s: float) -> grpc.StatusCode:
    try:
        list(stub.Generate(request, timeout=timeout_s))
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def _stats(service) -> dict[str, wpb.WorkerStats]:
    out = {}
    for role, stub_cls in (("decode", worker_pb2_grpc.DecodeWorkerStub), ("prefill", worker_pb2_grpc.PrefillWorkerStub)):
        with grpc.insecure_channel(service[role]) as ch:
            out[role] = stub_cls(ch).Stats(wpb.StatsRequest(), timeout=5)
    return out


def _held(stats: wpb.WorkerStats) -> tuple[int, int, int, int]:
    return stats.blocks_active, stats.blocks_held, stats.blocks_reserved, stats.blocks_quarantined


def _wait_all_free(service, timeout_s: float) -> dict[str, tuple[int, int, int, int]]:
    deadline = time.monotonic() + timeout_s
    while True:
        held = {role: _held(s) for role, s in _stats(service).items()}
        if all(h == (0, 0, 0, 0) for h in held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.1)


def test_random_client_deadlines_leave_every_worker_with_nothing_held(service, channel):
    stub = generation_pb2_grpc.GenerationStub(channel)
    rng = random.Random(11)
    deadlines = [rng.uniform(0.001, 0.5) for _ in range(REQUESTS)]
    requests = [_prompt(i) for i in range(REQUESTS)]
    with concurrent.futures.ThreadPoolExecutor(REQUESTS) as pool:
        codes = list(pool.map(lambda pair: _status(stub, *pair), zip(requests, deadlines)))
    assert set(codes) == {grpc.StatusCode.DEADLINE_EXCEEDED}
    assert _wait_all_free(service, 5.0) == {"decode": (0, 0, 0, 0), "prefill": (0, 0, 0, 0)}
    assert len(stream(stub, _prompt(999), timeout=120).token_ids) == 8  # the service answers as before


def test_max_tokens_1_finishes_with_length(service, channel):
    stub = generation_pb2_grpc.GenerationStub(channel)
    request = pb.GenerateRequest(text="The capital of France is",
                                 sampling=pb.SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    result = stream(stub, request, timeout=30)
    assert result.finish_reason == "FINISH_REASON_LENGTH" and len(result.token_ids) == 1
    assert _wait_all_free(service, 5.0) == {"decode": (0, 0, 0, 0), "prefill": (0, 0, 0, 0)}
