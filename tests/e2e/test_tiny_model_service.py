"""A tiny random Qwen2 (q/k/v biases, its own tokenizer) through the whole disaggregated service:
greedy outputs equal transformers' generate() token for token."""

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
from tests.helpers.reference import hf_greedy

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(600)]

PROMPTS = [[5, 17, 33, 2, 9], list(range(3, 40)), [11] * 70]
NEW_TOKENS = 12
KV_BLOCKS = 64  # each worker's --kv-blocks
BLOCK_TOKENS = CacheConfig().block_size  # the workers' default
MAX_POSITIONS = 1024  # room for one request to hold nearly the whole pool


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.helpers.tiny_models import tiny_qwen2_bias

    return tiny_qwen2_bias(tmp_path_factory.mktemp("tiny") / "qwen2", max_positions=MAX_POSITIONS)


@pytest.fixture(scope="module")
def client(tiny):
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    flags = ["--port", "0", "--model", str(tiny), "--threads", "1", "--kv-blocks", str(KV_BLOCKS),
             "--host-kv-blocks", "16", "--token-budget", "256", "--max-chunk-tokens", "16", *cluster_flags(sup.workdir)]
    try:
        workers = [sup.spawn(role, [role, *flags]) for role in ("prefill", "decode")]
        p, d = (sup.wait_ready(w, 300) for w in workers)
        router = sup.spawn("router", ["router", "--port", "0", "--model", str(tiny), "--prefill-workers",
                                      f"127.0.0.1:{p}", "--decode-workers", f"127.0.0.1:{d}",
                                      *cluster_flags(sup.workdir)])
        address = f"127.0.0.1:{sup.wait_ready(router, 300)}"
        wait_serving(address, 60)
        with Client(address, ClientOptions(timeout_s=300)) as client:
            yield client
    finally:
        sup.stop()


def _greedy(client: Client, prompt: list[int]):
    return client.generate(token_ids=prompt, max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)


def test_tiny_qwen2_greedy_through_the_service_equals_transformers(tiny, client):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    expected = [hf_greedy(model, prompt, NEW_TOKENS) for prompt in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda prompt: _greedy(client, prompt), PROMPTS))
    for result, want in zip(results, expected):
        assert result.token_ids == want


def test_tiny_qwen2_conversation_turns_reuse_the_decode_workers_kv_and_equal_transformers(tiny, client):
    """Turn k's prompt is turn k-1's prompt, its answer and new ids: a short new part is
    prefilled on the decode worker over its cached prefix, a long one by the prefill worker,
    which sends only the blocks past it; every turn equals transformers on its whole prompt."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    prompt = [(7 * i) % 90 + 3 for i in range(80)]
    seen = []
    for new in ([41, 42, 43], [(5 * i) % 80 + 4 for i in range(300)], [8, 9]):
        answer = _greedy(client, prompt)
        assert answer.token_ids == hf_greedy(model, prompt, NEW_TOKENS)
        seen.append(answer.usage)
        prompt = [*prompt, *answer.token_ids, *new]
    first, short, long = seen
    assert first.decode_cached_tokens == 0 and not first.local_prefill
    assert short.local_prefill and short.kv_transfer_bytes == 0 and short.decode_cached_tokens >= 80 // 16 * 16
    assert not long.local_prefill and long.decode_cached_tokens >= short.prompt_tokens // 16 * 16
    per_block = first.kv_transfer_bytes / 5  # 80 prompt tokens in blocks of 16 (the workers' default)
    new_blocks = -(-(long.prompt_tokens - long.decode_cached_tokens) // 16)
    assert 0 < long.kv_transfer_bytes <= (new_blocks + 1) * per_block


def test_tiny_qwen2_later_turns_preempted_over_their_cached_conversation_still_equal_transformers(tiny, client):
    """Later turns decoding over blocks they share with their cached conversation lose their pool
    (preempted: swapped or recomputed), to each other and to higher-priority requests, and still
    equal transformers. A turn holds its prompt's blocks from its start, and ends holding one block
    more than the pool leaves beside another turn's prompt: once the worker admits a second turn
    while the first runs it must preempt, however fast or slow it decodes."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    openings = [[(11 * i + 7 * c) % 90 + 3 for i in range(120)] for c in range(3)]
    pressure = [[(13 * i + 5 * c) % 85 + 4 for i in range(300)] for c in range(3)]
    turns = [[*p, *_greedy(client, p).token_ids, 21, 22, 23] for p in openings]
    start_blocks = -(-len(turns[0]) // BLOCK_TOKENS)
    end_blocks = KV_BLOCKS - start_blocks + 1
    new_tokens = end_blocks * BLOCK_TOKENS - len(turns[0]) + 1  # KV at the end: the turn, outputs but one
    assert end_blocks + start_blocks > KV_BLOCKS and len(turns[0]) + new_tokens < MAX_POSITIONS
    streams = [client.stream(token_ids=t, max_tokens=new_tokens, priority="batch", temperature=0, ignore_eos=True)
               for t in turns]
    heads = [next(s) for s in streams]  # each turn placed and past its first token
    with concurrent.futures.ThreadPoolExecutor(len(pressure)) as pool:
        pushed = list(pool.map(lambda p: client.generate(token_ids=p, max_tokens=24, temperature=0, ignore_eos=True,
                                                         priority="normal"), pressure))
    later = [s.collect() for s in streams]
    for turn, head, rest in zip(turns, heads, later):
        assert [*head.token_ids, *rest.token_ids] == hf_greedy(model, turn, new_tokens)
    for prompt, result in zip(pressure, pushed):
        assert result.token_ids == hf_greedy(model, prompt, 24)
    usages = [r.usage for r in later]
    assert sum(u.preemptions for u in usages) > 0
    assert all(u.local_prefill and u.decode_cached_tokens >= 112 for u in usages)  # 120 ids cached, in blocks of 16
