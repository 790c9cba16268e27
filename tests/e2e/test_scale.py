"""2 prefill + 2 decode workers with tiny KV pools: preemption of both kinds through the service,
and 100 random cancellations that must leave no block behind."""

from __future__ import annotations

import concurrent.futures
import os
import random
import time

import grpc
import pytest

from tests.helpers.streams import stream
from pdserve.cli.supervisor import Supervisor
from pdserve.cli.up import wait_serving
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from tests.helpers.cluster import cluster_flags

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

COMMON = ["--port", "0", "--threads", "1", "--token-budget", "256", "--max-chunk-tokens", "64"]
# decode-0 always swaps, decode-1 always recomputes; 20 blocks = 320 tokens each
DECODE = {"decode-0": ["--kv-blocks", "20", "--host-kv-blocks", "64", "--recompute-below-tokens", "0",
                       "--swap-above-tokens", "0"],
          "decode-1": ["--kv-blocks", "20", "--host-kv-blocks", "64", "--recompute-below-tokens", "100000"]}
PROMPTS = [f"Tell me a long story about the city number {i} and its people." for i in range(6)]
MAX_TOKENS = 100


@pytest.fixture(scope="module")
def cluster():
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n"})
    secured = cluster_flags(sup.workdir)
    try:
        prefill = [sup.spawn(f"prefill-{i}", ["prefill", *COMMON, "--kv-blocks", "256", *secured]) for i in range(2)]
        decode = [sup.spawn(name, ["decode", *COMMON, *flags, *secured]) for name, flags in DECODE.items()]
        p = [f"127.0.0.1:{sup.wait_ready(c, 300)}" for c in prefill]
        d = [f"127.0.0.1:{sup.wait_ready(c, 300)}" for c in decode]
        router = sup.spawn("router", ["router", "--port", "0", "--prefill-workers", ",".join(p),
                                      "--decode-workers", ",".join(d), "--kv-timeout", "10", *secured])
        target = f"127.0.0.1:{sup.wait_ready(router, 300)}"
        wait_serving(target, 60)
        yield {"target": target, "prefill": p, "decode": d}
    finally:
        sup.stop()


@pytest.fixture(scope="module")
def reference():
    from pdserve.config import EngineConfig
    from pdserve.engine.llm import LLM
    from pdserve.requests import SamplingParams

    llm = LLM(EngineConfig())
    return [c.token_ids for c in llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                                      ignore_eos=True))]


def _request(text: str, max_tokens: int = MAX_TOKENS) -> pb.GenerateRequest:
    return pb.GenerateRequest(text=text, sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0,
                                                                    ignore_eos=True))


def test_preemption_of_both_kinds_keeps_greedy_outputs_identical(cluster, reference):
    with grpc.insecure_channel(cluster["target"]) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            results = list(pool.map(lambda p: stream(stub, _request(p), timeout=600), PROMPTS))
    for result, expected in zip(results, reference):
        assert tuple(result.token_ids) == tuple(expected)
    assert sum(r.usage.preemptions for r in results) >= 2
    assert _active_blocks(cluster) == [0, 0, 0, 0]


def test_hundred_random_cancellations_leave_no_active_block(cluster):
    rng = random.Random(7)
    with grpc.insecure_channel(cluster["target"]) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)

        def cancel_after(i: int) -> None:
            call = stub.Generate(_request(f"Cancellation {i}: " + "word " * rng.randrange(5, 120), 60), timeout=120)
            time.sleep(rng.uniform(0.0, 2.5))
            call.cancel()

        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            list(pool.map(cancel_after, range(100)))
        deadline = time.monotonic() + 60
        while _active_blocks(cluster) != [0, 0, 0, 0] and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _active_blocks(cluster) == [0, 0, 0, 0]
        assert len(stream(stub, _request("Still serving?", 4), timeout=300).token_ids) == 4


def _active_blocks(cluster) -> list[int]:
    counts = []
    for address, stub_cls in [*((a, worker_pb2_grpc.PrefillWorkerStub) for a in cluster["prefill"]),
                              *((a, worker_pb2_grpc.DecodeWorkerStub) for a in cluster["decode"])]:
        with grpc.insecure_channel(address) as channel:
            counts.append(stub_cls(channel).Stats(wpb.StatsRequest(), timeout=10).blocks_active)
    return counts
