"""2 prefill + 2 decode workers with tiny KV pools: preemption through the service, each decode
worker's of its own kind, and 100 random cancellations that must leave no block behind. The workers
serve a tiny random model, each step paced to about the embedded model's pace here
(tests/helpers/pacing.py): the cancellations land mid-stream while the workers spend almost no CPU."""

from __future__ import annotations

import concurrent.futures
import os
import random
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions
from pdserve.config import CacheConfig
from pdserve.procs.health import wait_serving
from tests.helpers.cluster import cluster_flags
from tests.helpers.pacing import allow_pacing, greedy_outputs, pace_all, tiny_model
from tests.helpers.waiting import WaitTimeout, wait_until
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(900)]

COMMON = ["--port", "0", "--threads", "1", "--token-budget", "256", "--max-chunk-tokens", "64"]
KV_BLOCKS = 12  # each decode worker's --kv-blocks
BLOCK_TOKENS = CacheConfig().block_size  # the workers' default
PROMPTS = [f"Tell me a long story about the city number {i}: its streets, its markets, its rivers and the people "
           "who live there." for i in range(6)]
HOST_BLOCKS = len(PROMPTS) * KV_BLOCKS  # decode-0's host pool: room for every stream swapped out at once
# decode-0 always swaps (its host pool never runs out), decode-1 always recomputes; no time slices: a
# slice's victim is swapped wherever that is quicker, whatever the worker's policy for memory
# (pdserve/scheduler/preemption_mode.py), and decode-1 swapped its streams' slices once the six were
# spread three and three
DECODE = {"decode-0": ["--kv-blocks", str(KV_BLOCKS), "--host-kv-blocks", str(HOST_BLOCKS),
                       "--recompute-below-tokens", "0", "--swap-above-tokens", "0", "--time-slice-s", "0"],
          "decode-1": ["--kv-blocks", str(KV_BLOCKS), "--host-kv-blocks", "64", "--recompute-below-tokens", "100000",
                       "--time-slice-s", "0"]}
MODE = {"decode-0": "swap", "decode-1": "recompute"}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return tiny_model(tmp_path_factory, "scale")


@pytest.fixture(scope="module")
def cluster(model):
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    allow_pacing(sup)
    secured = cluster_flags(sup.workdir)
    common = [*COMMON, "--model", model]
    try:
        prefill = [sup.spawn(f"prefill-{i}", ["prefill", *common, "--kv-blocks", "256", *secured]) for i in range(2)]
        decode = {name: sup.spawn(name, ["decode", *common, *flags, "--metrics-port", "0", *secured])
                  for name, flags in DECODE.items()}
        pace_all(sup, (*prefill, *decode.values()))
        p = [f"127.0.0.1:{sup.wait_ready(c, 300)}" for c in prefill]
        d = [f"127.0.0.1:{sup.wait_ready(c, 300)}" for c in decode.values()]
        router = sup.spawn("router", ["router", "--port", "0", "--model", model, "--prefill-workers", ",".join(p),
                                      "--decode-workers", ",".join(d), "--kv-timeout", "10",
                                      "--rebalance-interval-s", "0",  # a stream stays on its worker: each preempts its way
                                      *secured])
        target = f"127.0.0.1:{sup.wait_ready(router, 300)}"
        wait_serving(target, 60)
        with Client(target, ClientOptions(timeout_s=600)) as client:
            yield {"client": client, "prefill": p, "decode": d,
                   "metrics_ports": {name: c.metrics_port for name, c in decode.items()}}
    finally:
        sup.stop()


@pytest.fixture(scope="module")
def long_streams(model):
    """Every stream's tokens and the greedy reference. Each stream ends holding all but one block
    of a decode pool, and holds at least two from its start, so no two of them fit one pool to
    their ends: a decode worker that admits a second stream while the first still runs (below
    its last two blocks, all the admission watermark leaves it) must preempt one of them, by
    arithmetic, however fast or slow it decodes."""
    from pdserve.tokenizer import load_tokenizer

    prompts = [load_tokenizer(model).encode(p) for p in PROMPTS]
    # a stream's KV at its end: its prompt and every output but the last
    max_tokens = (KV_BLOCKS - 1) * BLOCK_TOKENS - max(map(len, prompts)) + 1
    final = [-(-(len(p) + max_tokens - 1) // BLOCK_TOKENS) for p in prompts]
    first = [-(-len(p) // BLOCK_TOKENS) for p in prompts]
    assert max(final) < KV_BLOCKS  # one stream alone fits a pool
    assert min(final) + min(first) > KV_BLOCKS  # two on one pool do not
    assert HOST_BLOCKS >= sum(final)  # decode-0 never lacks host blocks to swap into
    return {"prompts": prompts, "max_tokens": max_tokens, "expected": greedy_outputs(model, prompts, max_tokens)}


GREEDY = {"temperature": 0, "ignore_eos": True}


def test_preemption_keeps_greedy_outputs_identical_and_each_worker_preempts_its_own_way(cluster, long_streams):
    """The six streams are sent together to two decode workers: at least three share one, and
    each is hundreds of decode steps long, so that worker holds two at once and must preempt.
    Which worker serves which stream is the router's choice, so only each worker's kind is
    checked: decode-0 swaps, decode-1 recomputes, whichever streams they got."""
    client, before = cluster["client"], _preemptions_by_worker(cluster)
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: client.generate(p, max_tokens=long_streams["max_tokens"], **GREEDY),
                                PROMPTS))
    for result, prompt, expected in zip(results, long_streams["prompts"], long_streams["expected"]):
        assert result.usage.prompt_tokens == len(prompt)
        assert tuple(result.token_ids) == tuple(expected)
    usages = [r.usage for r in results]
    assert sum(u.preemptions for u in usages) >= 1
    for u in usages:  # each stream decoded on one worker: its preemptions are of that worker's kind
        assert u.swap_preemptions + u.recompute_preemptions == u.preemptions
        assert not (u.swap_preemptions and u.recompute_preemptions), u
    counted = {"swap": sum(u.swap_preemptions for u in usages),
               "recompute": sum(u.recompute_preemptions for u in usages)}

    def by_worker() -> dict[str, dict[str, float]]:
        after = _preemptions_by_worker(cluster)
        return {name: {mode: after[name][mode] - before[name][mode] for mode in MODE.values()} for name in MODE}

    # every preemption a stream was told of was counted by its worker (a worker may count more: one
    # told on a stream that broke and was resumed elsewhere reaches no client)
    def told_were_counted() -> bool:
        workers = by_worker()
        return all(sum(d[mode] for d in workers.values()) >= n for mode, n in counted.items())

    try:
        wait_until(told_were_counted, 30, f"the decode workers' preemption counters at least the streams' {counted}")
    except WaitTimeout as timeout:
        raise AssertionError(f"{timeout}; the workers counted {by_worker()}; the streams' (swap, recompute) "
                             f"{[(u.swap_preemptions, u.recompute_preemptions) for u in usages]}") from None
    print(f"preemptions by decode worker: {by_worker()}")
    for name, modes in by_worker().items():
        assert all(n == 0 for mode, n in modes.items() if mode != MODE[name]), (name, modes)
    # a worker frees a stream's blocks once its last token is out, not before the client reads it
    wait_until(lambda: _active_blocks(cluster) == [0, 0, 0, 0], 30, "every worker holding no block")


def _preemptions_by_worker(cluster) -> dict[str, dict[str, float]]:
    """pdserve_preemptions_total by mode, on each decode worker's /metrics."""
    found = {}
    for name, port in cluster["metrics_ports"].items():
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        samples = {s.labels.get("mode"): s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "pdserve_preemptions_total"}
        found[name] = {mode: samples.get(mode, 0.0) for mode in MODE.values()}
    return found


def test_hundred_random_cancellations_leave_no_active_block(cluster):
    rng, client = random.Random(7), cluster["client"]

    def cancel_after(i: int) -> None:
        call = client.stream(f"Cancellation {i}: " + "word " * rng.randrange(5, 60), max_tokens=60, timeout_s=120,
                             **GREEDY)
        time.sleep(rng.uniform(0.0, 2.5))
        call.cancel()

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        list(pool.map(cancel_after, range(100)))
    wait_until(lambda: _active_blocks(cluster) == [0, 0, 0, 0], 60, "every worker back to zero active blocks")
    assert len(client.generate("Still serving?", max_tokens=4, timeout_s=300, **GREEDY).token_ids) == 4


def _active_blocks(cluster) -> list[int]:
    return [worker_stats(address, role).blocks_active for role in ("prefill", "decode") for address in cluster[role]]
