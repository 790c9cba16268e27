"""Every architecture's tiny random checkpoint through the services, disaggregated (the prefill
worker's KV sent to the decode worker) and colocated (the decode worker prefills itself): greedy
ids equal transformers' generate token for token. Qwen2 and Gemma 3 have modules of their own
(test_tiny_model_service.py, test_gemma3_service.py); the embedded SmolLM2 (Llama) is everywhere.

Per model one fleet: a prefill worker P, a decode worker D, a router over both ("pd") and one
over D alone prefilling itself ("colocated"); small blocks and chunks so prompts cross both."""

from __future__ import annotations

import concurrent.futures
import os

import pytest

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions
from pdserve.procs.health import wait_serving
from tests.helpers.cluster import cluster_flags
from tests.helpers.reference import hf_greedy
from tests.helpers.tiny_models import VOCAB_SIZE, tiny_llama_gqa_llama3, tiny_mistral, tiny_qwen3
from tests.helpers.waiting import wait_until
from tests.helpers.worker_stats import worker_stats
from tests.model.test_model_parity import tiny_prompt

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(600)]

MODELS = {"llama_gqa_llama3": tiny_llama_gqa_llama3, "mistral": tiny_mistral, "qwen3": tiny_qwen3}
LENGTHS = (5, 37, 90)
NEW_TOKENS = 12
WORKER = ["--threads", "1", "--block-size", "4", "--kv-blocks", "128", "--host-kv-blocks", "16",
          "--token-budget", "256", "--max-chunk-tokens", "13"]


@pytest.fixture(scope="module", params=sorted(MODELS))
def served(request, tmp_path_factory):
    """(checkpoint folder, {"pd": address, "colocated": address}, worker addresses by role)."""
    folder = MODELS[request.param](tmp_path_factory.mktemp(request.param) / request.param)
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    secured = cluster_flags(sup.workdir)
    try:
        children = {role: sup.spawn(role, [role, "--port", "0", "--model", str(folder), *WORKER, *secured])
                    for role in ("prefill", "decode")}
        at = {role: f"127.0.0.1:{sup.wait_ready(child, 300)}" for role, child in children.items()}
        common = ["--port", "0", "--model", str(folder), "--canary-interval-s", "0", "--decode-workers", at["decode"],
                  *secured]
        routers = {"pd": sup.spawn("pd", ["router", *common, "--prefill-workers", at["prefill"]]),
                   "colocated": sup.spawn("colocated", ["router", *common, "--colocated"])}
        addresses = {name: f"127.0.0.1:{sup.wait_ready(child, 300)}" for name, child in routers.items()}
        for address in addresses.values():
            wait_serving(address, 60)
        yield folder, addresses, at
    finally:
        sup.stop()


@pytest.fixture(scope="module")
def reference(served):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(served[0])).eval()
    return lambda prompt: hf_greedy(model, prompt, NEW_TOKENS)


@pytest.mark.parametrize("router", ["pd", "colocated"])
def test_greedy_through_the_service_equals_transformers(served, reference, router):
    _, addresses, workers = served
    prompts = [tiny_prompt(n, VOCAB_SIZE, seed=n + len(router)) for n in LENGTHS]
    with Client(addresses[router], ClientOptions(timeout_s=300)) as client, \
            concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: client.generate(token_ids=p, max_tokens=NEW_TOKENS, temperature=0,
                                                          ignore_eos=True), prompts))
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference(prompt)
        assert result.usage.local_prefill == (router == "colocated")
        assert (result.usage.kv_transfer_bytes > 0) == (router == "pd")
    wait_until(lambda: all(worker_stats(a, role).blocks_active == 0 for role, a in workers.items()), 30,
               "every worker holding no block")
