"""A rolling update leaves workers of two kinds side by side: nothing is served wrong or lost.

Fleet: a router and a prefill worker on tiny model A, decode worker D0 on A, decode worker D1 on
model B (the same architecture and shapes, other weights), then on A with another block size.
Every greedy output equals transformers' on model A; the odd worker is marked (the router's
metric) and gets no work; restarted as before, it serves again."""

from __future__ import annotations

import concurrent.futures
import os

import pytest
import torch

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions
from pdserve.config import CacheConfig
from pdserve.procs.health import wait_serving
from tests.helpers.cluster import cluster_flags
from tests.helpers.metrics import counters
from tests.helpers.reference import hf_greedy
from tests.helpers.waiting import wait_for
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(600)]

PROMPTS = [[(7 * i + k) % 300 + 3 for i in range(20 + 9 * k)] for k in range(12)]


def _fresh(k: int) -> list[int]:
    """The k-th of prompts no worker holds (each its own first token): a worker that holds a prompt's
    prefix is the router's choice for it (router/placement/placement.py), so rounds of the same
    prompts stay on D0 until its cache lets them go (a minute here)."""
    return [(11 * i + k) % 300 + 5 for i in range(24 + 5 * (k % 12))]


NEW_TOKENS = 10
BLOCK = CacheConfig().block_size  # the workers' default
ENGINE = ["--threads", "1", "--kv-blocks", "64", "--host-kv-blocks", "16", "--token-budget", "256",
          "--max-chunk-tokens", "64"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.helpers.tiny_models import tiny_llama_gqa_llama3

    root = tmp_path_factory.mktemp("rolling")
    return tiny_llama_gqa_llama3(root / "a", seed=0), tiny_llama_gqa_llama3(root / "b", seed=7)


def _incompatible(router) -> dict[str, float]:
    return counters(router.metrics_port, "pdserve_incompatible_workers", "field")


def _all_greedy(address: str, prompts: list[list[int]] = PROMPTS) -> list[list[int]]:
    with Client(address, ClientOptions(timeout_s=300)) as client:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            return [r.token_ids for r in pool.map(
                lambda p: client.generate(token_ids=p, max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True), prompts)]


def _received(address: str) -> int:
    return sum(worker_stats(address, "decode").kv_rank_bytes)


def test_a_decode_worker_of_another_model_or_block_size_never_serves_and_nothing_is_wrong(models):
    from transformers import AutoModelForCausalLM

    a, b = models
    reference = AutoModelForCausalLM.from_pretrained(a, dtype=torch.float32)
    expected = [hf_greedy(reference, p, NEW_TOKENS) for p in PROMPTS]
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    secured = cluster_flags(sup.workdir)
    try:
        spawn = {"P": ("prefill", a, []), "D0": ("decode", a, []), "D1": ("decode", b, [])}
        children = {n: sup.spawn(n, [role, "--port", "0", "--model", str(m), *ENGINE, *secured, *extra])
                    for n, (role, m, extra) in spawn.items()}
        address = {n: f"127.0.0.1:{sup.wait_ready(c, 300)}" for n, c in children.items()}
        router = sup.spawn("router", ["router", "--port", "0", "--model", str(a), "--prefill-workers", address["P"],
                                      "--decode-workers", f"{address['D0']},{address['D1']}", "--metrics-port", "0",
                                      *secured])
        target = f"127.0.0.1:{sup.wait_ready(router, 300)}"
        wait_serving(target, 60)
        wait_for(lambda: _incompatible(router).get("weights"), 30, "D1 marked as serving other weights")
        assert _all_greedy(target) == expected
        assert _received(address["D1"]) == 0 and worker_stats(address["D1"], "decode").blocks_active == 0

        port = address["D1"].rsplit(":", 1)[1]

        def restart_d1(name: str, *extra: str) -> None:
            old = children.pop("D1") if "D1" in children else children.pop("D1-now")
            sup.kill(old)
            sup.wait_exit(old, 30)
            children["D1-now"] = sup.spawn(name, ["decode", "--port", port, "--model", str(a), *ENGINE, *extra,
                                                  *secured])
            sup.wait_ready(children["D1-now"], 300)

        # D1 restarted on model A with another block size: the router's model, but no KV P could fill
        restart_d1("D1-blocks", "--block-size", "8")
        wait_for(lambda: worker_stats(address["D1"], "decode").identity.block_size == 8, 30, "D1 back, 8-token blocks")
        assert _all_greedy(target) == expected
        assert _received(address["D1"]) == 0

        # restarted as before the update: it serves again
        restart_d1("D1-as-before")
        wait_for(lambda: worker_stats(address["D1"], "decode").identity.block_size == BLOCK, 30, "D1 back as before")

        rounds: list[bool] = []  # whether each round was all right (wait_for would swallow an assertion)

        def served_by_d1() -> bool:
            prompts = [_fresh(4 * len(rounds) + i) for i in range(4)]  # four at once: some are D1's
            rounds.append(_all_greedy(target, prompts) == [hf_greedy(reference, p, NEW_TOKENS) for p in prompts])
            return _received(address["D1"]) > 0

        wait_for(served_by_d1, 120, "D1 serving again")
        assert all(rounds)
        for name in ("P", "D0"):
            role = "prefill" if name == "P" else "decode"
            wait_for(lambda a=address[name], r=role: worker_stats(a, r).blocks_active == 0 or None, 30, f"{name} idle")
    finally:
        sup.stop()
