"""A fleet whose workers hold bfloat16 KV below a float32 model (`--kv-cache-dtype bfloat16`), one
prefill and two decode workers: the prefill worker's half blocks travel to a decode worker, which
decodes over them; greedy outputs follow transformers over a cache rounded alike
(tests/engine/test_engine_kv_dtype.py says why up to near ties), also for streams whose decode
worker is killed under them (resumed on the other), every worker left at zero active blocks; a
prompt moves two bytes an element."""

from __future__ import annotations

import concurrent.futures
import os
import signal

import pytest
import torch

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions
from pdserve.procs.health import wait_serving
from tests.helpers.cluster import cluster_flags
from tests.helpers.reference import hf_greedy, parted_off_a_tie
from tests.helpers.waiting import wait_for, wait_until
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
        workers = {name: sup.spawn(name, [name.split("-")[0], *flags]) for name in ("prefill", "decode-0", "decode-1")}
        addresses = {name: f"127.0.0.1:{sup.wait_ready(w, 300)}" for name, w in workers.items()}
        decodes = ",".join(addresses[n] for n in ("decode-0", "decode-1"))
        router = sup.spawn("router", ["router", "--port", "0", "--model", str(tiny), "--prefill-workers",
                                      addresses["prefill"], "--decode-workers", decodes, *cluster_flags(sup.workdir)])
        address = f"127.0.0.1:{sup.wait_ready(router, 300)}"
        wait_serving(address, 60)
        with Client(address, ClientOptions(timeout_s=300)) as client:
            yield {"client": client, "sup": sup, "workers": workers, "prefill": addresses["prefill"],
                   "decode": addresses["decode-0"], "decodes": {n: addresses[n] for n in ("decode-0", "decode-1")}}
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
    _idle(fleet, fleet["decodes"].values())


def test_the_workers_say_they_hold_bfloat16_kv_and_a_prompt_moves_two_bytes_an_element(tiny, fleet):
    from transformers import AutoConfig

    assert {worker_stats(fleet[r], r).identity.kv_dtype for r in ("prefill", "decode")} == {"torch.bfloat16"}
    config = AutoConfig.from_pretrained(tiny)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    block_bytes = config.num_hidden_layers * 2 * 16 * config.num_key_value_heads * head_dim * 2
    prompt = list(range(50, 87))  # 37 tokens: three blocks of 16
    result = fleet["client"].generate(token_ids=prompt, max_tokens=2, temperature=0, ignore_eos=True)
    assert result.usage.kv_transfer_bytes == 3 * block_bytes


def test_streams_whose_decode_worker_is_killed_resume_over_the_other_and_follow_transformers(tiny, fleet):
    """Run last: it kills a decode worker. The streams resume on the other (their prompt and tokens
    so far prefilled again, the half blocks sent there); each still follows transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    prompts, tokens = [list(range(100 + 7 * i, 140 + 7 * i)) for i in range(4)], 400  # 440 of 512 positions

    def busy() -> str | None:
        return next((n for n, a in fleet["decodes"].items() if worker_stats(a, "decode").requests_running > 0), None)

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(fleet["client"].generate, token_ids=p, max_tokens=tokens, temperature=0,
                               ignore_eos=True) for p in prompts]
        victim = wait_for(busy, 120, "a decode worker decoding some of the streams")
        fleet["sup"].kill(fleet["workers"][victim], signal.SIGKILL)
        results = [f.result() for f in futures]
    for prompt, result in zip(prompts, results):
        theirs = hf_greedy(model, prompt, tokens, torch.bfloat16)
        problem = parted_off_a_tie(model, prompt, list(result.token_ids), theirs, torch.bfloat16, MARGIN_TOLERANCE)
        assert problem is None, problem
    _idle(fleet, [a for n, a in fleet["decodes"].items() if n != victim])


def _idle(fleet, decodes) -> None:
    wait_until(lambda: worker_stats(fleet["prefill"], "prefill").blocks_active == 0
               and all(worker_stats(a, "decode").blocks_active == 0 for a in decodes), 30,
               "every worker back to zero active blocks")
