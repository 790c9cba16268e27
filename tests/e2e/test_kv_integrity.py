"""A KV piece corrupted in flight never yields a token: the prefill worker's next piece has one
byte flipped after it was summed (PDSERVE_KV_CORRUPT_FILE), the decode worker finds the sums
differ before the request decodes, and the router retries it (the sender charged, the failure
counted): the client gets transformers' greedy output, and both workers end holding no block.

Fleet: a router, a prefill and a decode worker on a tiny model, checksums on (the default)."""

from __future__ import annotations

import os

import pytest
import torch

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions
from pdserve.procs.health import wait_serving
from pdserve.worker.kv_sums import CORRUPT_ENV
from tests.helpers.cluster import cluster_flags
from tests.helpers.metrics import counters
from tests.helpers.reference import hf_greedy
from tests.helpers.waiting import wait_for
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(600)]

PROMPT = [(5 * i) % 300 + 3 for i in range(90)]
NEW_TOKENS = 12
ENGINE = ["--threads", "1", "--kv-blocks", "64", "--host-kv-blocks", "16", "--token-budget", "256",
          "--max-chunk-tokens", "32"]


def _corrupt_kv_count(router) -> float:
    return counters(router.metrics_port, "pdserve_kv_checksum_failures").get("", 0.0)


def test_a_corrupted_piece_never_yields_a_token_and_the_request_is_served_right(tmp_path):
    from transformers import AutoModelForCausalLM

    from tests.helpers.tiny_models import tiny_llama_gqa_llama3

    model = tiny_llama_gqa_llama3(tmp_path / "model")
    expected = hf_greedy(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), PROMPT, NEW_TOKENS)
    trigger = tmp_path / "corrupt-next-piece"
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1",
                          CORRUPT_ENV: str(trigger)})
    secured = cluster_flags(sup.workdir)
    try:
        workers = {role: sup.spawn(role, [role, "--port", "0", "--model", str(model), *ENGINE, *secured])
                   for role in ("prefill", "decode")}
        address = {role: f"127.0.0.1:{sup.wait_ready(w, 300)}" for role, w in workers.items()}
        router = sup.spawn("router", ["router", "--port", "0", "--model", str(model), "--prefill-workers",
                                      address["prefill"], "--decode-workers", address["decode"],
                                      "--metrics-port", "0",
                                      "--canary-interval-s", "0", *secured])  # the one corrupted piece is ours
        target = f"127.0.0.1:{sup.wait_ready(router, 300)}"
        wait_serving(target, 60)
        trigger.write_text("")
        with Client(target, ClientOptions(timeout_s=120)) as client:
            result = client.generate(token_ids=PROMPT, max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
        assert not trigger.exists()  # the corruption happened
        assert result.token_ids == expected
        assert _corrupt_kv_count(router) == 1
        for role, a in address.items():
            wait_for(lambda a=a, r=role: worker_stats(a, r).blocks_active == 0 or None, 30, f"{role} holding no block")
    finally:
        sup.stop()
