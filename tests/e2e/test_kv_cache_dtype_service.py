"""A fleet whose workers hold bfloat16 KV below a float32 model (`--kv-cache-dtype bfloat16`): the
prefill worker's half blocks travel to the decode worker, which decodes over them; greedy outputs
follow transformers over a cache rounded alike (tests/engine/test_engine_kv_dtype.py says why up
to near ties), and the decode worker's pool holds half the bytes a float32 one would."""

from __future__ import annotations

import concurrent.futures
import os

import pytest
import torch

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions
from pdserve.procs.health import wait_serving
from tests.helpers.cluster import cluster_flags
from tests.helpers.reference import hf_greedy, parted_off_a_tie
from tests.helpers.waiting import wait_until
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(600)]

PROMPTS = [[5, 17, 33, 2, 9], list(range(3, 40)), [11] * 70]
NEW_TOKENS = 16
MARGIN_TOLERANCE = 0.05  # as the engine's test
KV_BLOCKS = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.helpers.tiny_models import tiny_qwen2_bias

    return tiny_qwen2_bias(tmp_path_factory.mktemp("tiny") / "qwen2")


@pytest.fixture(scope="module")
def fleet(tiny):
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    flags = ["--port", "0", "--model", str(tiny), "--threads", "1", "--kv-blocks", str(KV_BLOCKS),
             "--host-kv-blocks", "16", "--token-budget", "256", "--max-chunk-tokens", "16",
             "--kv-cache-dtype", "bfloat16", *cluster_flags(sup.workdir)]
    try:
        workers = [sup.spawn(role, [role, *flags]) for role in ("prefill", "decode")]
        p, d = (f"127.0.0.1:{sup.wait_ready(w, 300)}" for w in workers)
        router = sup.spawn("router", ["router", "--port", "0", "--model", str(tiny), "--prefill-workers", p,
                                      "--decode-workers", d, *cluster_flags(sup.workdir)])
        address = f"127.0.0.1:{sup.wait_ready(router, 300)}"
        wait_serving(address, 60)
        with Client(address, ClientOptions(timeout_s=300)) as client:
            yield {"client": client, "prefill": p, "decode": d}
    finally:
        sup.stop()


def test_greedy_through_a_bfloat16_fleet_follows_transformers_over_a_cache_rounded_alike(tiny, fleet):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: fleet["client"].generate(token_ids=p, max_tokens=NEW_TOKENS, temperature=0,
                                                                   ignore_eos=True), PROMPTS))
    for prompt, result in zip(PROMPTS, results):
        assert result.usage.kv_transfer_bytes > 0  # its prompt's KV came from the prefill worker
        theirs = hf_greedy(model, prompt, NEW_TOKENS, torch.bfloat16)
        problem = parted_off_a_tie(model, prompt, list(result.token_ids), theirs, torch.bfloat16, MARGIN_TOLERANCE)
        assert problem is None, problem
    wait_until(lambda: all(worker_stats(fleet[r], r).blocks_active == 0 for r in ("prefill", "decode")), 30,
               "every worker back to zero active blocks")


def test_the_workers_say_they_hold_bfloat16_kv_and_a_prompt_moves_two_bytes_an_element(tiny, fleet):
    from transformers import AutoConfig

    assert {worker_stats(fleet[r], r).identity.kv_dtype for r in ("prefill", "decode")} == {"torch.bfloat16"}
    config = AutoConfig.from_pretrained(tiny)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    block_bytes = config.num_hidden_layers * 2 * 16 * config.num_key_value_heads * head_dim * 2
    prompt = list(range(50, 87))  # 37 tokens: three blocks of 16
    result = fleet["client"].generate(token_ids=prompt, max_tokens=2, temperature=0, ignore_eos=True)
    assert result.usage.kv_transfer_bytes == 3 * block_bytes
