"""2 prefill + 2 decode workers with tiny KV pools: preemption of both kinds through the service,
and 100 random cancellations that must leave no block behind."""

from __future__ import annotations

import concurrent.futures
import os
import random
import time

import pytest

from pdserve.cli.supervisor import Supervisor
from pdserve.cli.up import wait_serving
from pdserve.client import Client, ClientOptions
from tests.helpers.cluster import cluster_flags
from tests.helpers.waiting import wait_until
from tests.helpers.worker_stats import worker_stats

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
        with Client(target, ClientOptions(timeout_s=600)) as client:
            yield {"client": client, "prefill": p, "decode": d}
    finally:
        sup.stop()


@pytest.fixture(scope="module")
def reference(reference_llm):
    from pdserve.requests import SamplingParams

    return [c.token_ids for c in reference_llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                                                ignore_eos=True))]


GREEDY = {"temperature": 0, "ignore_eos": True}


def test_preemption_of_both_kinds_keeps_greedy_outputs_identical(cluster, reference):
    client = cluster["client"]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: client.generate(p, max_tokens=MAX_TOKENS, **GREEDY), PROMPTS))
    for result, expected in zip(results, reference):
        assert tuple(result.token_ids) == tuple(expected)
    assert sum(r.usage.preemptions for r in results) >= 2
    assert _active_blocks(cluster) == [0, 0, 0, 0]


def test_hundred_random_cancellations_leave_no_active_block(cluster):
    rng, client = random.Random(7), cluster["client"]

    def cancel_after(i: int) -> None:
        call = client.stream(f"Cancellation {i}: " + "word " * rng.randrange(5, 120), max_tokens=60, timeout_s=120,
                             **GREEDY)
        time.sleep(rng.uniform(0.0, 2.5))
        call.cancel()

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        list(pool.map(cancel_after, range(100)))
    wait_until(lambda: _active_blocks(cluster) == [0, 0, 0, 0], 60, "every worker back to zero active blocks")
    assert len(client.generate("Still serving?", max_tokens=4, timeout_s=300, **GREEDY).token_ids) == 4


def _active_blocks(cluster) -> list[int]:
    return [worker_stats(address, role).blocks_active for role in ("prefill", "decode") for address in cluster[role]]
