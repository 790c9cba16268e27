"""Disaggregated serving across tensor-parallel layouts, real processes behind a real router:
a prefill worker at size p hands KV to a decode worker at size d; greedy outputs equal
transformers, and every rank sent or received exactly its own heads' share of the bytes."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions
from pdserve.procs.health import wait_serving
from tests.helpers.cluster import cluster_flags
from tests.helpers.hosts import test_hosts
from tests.helpers.reference import hf_greedy
from tests.helpers.worker_stats import wait_no_active_blocks, worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
PROMPTS = [[1, 5, 17, 33, 2, 9], [1, *range(3, 40)]]
NEW_TOKENS = 8
BLOCK = 16
FLAGS = ["--threads", "1", "--kv-blocks", "64", "--host-kv-blocks", "0", "--token-budget", "256",
         "--max-chunk-tokens", "16", "--block-size", str(BLOCK)]


class _Here:
    """Every process on this host, on loopback."""

    address = "127.0.0.1"

    @staticmethod
    def launcher() -> list[str]:
        return []


@contextlib.contextmanager
def _places(across: bool):
    """(router, prefill, decode) hosts: three test hosts, or this one for all."""
    if not across:
        yield _Here, _Here, _Here
        return
    with test_hosts(3) as net:
        yield tuple(net.hosts)


@contextlib.contextmanager
def fleet(model, prefill_tp: int, decode_tp: int, across: bool = False):
    """A prefill worker at `prefill_tp`, a decode worker at `decode_tp`, a router (`across`: each on
    a test host of its own); yields (supervisor, prefill, decode, {role: address}, client)."""
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    secured = cluster_flags(sup.workdir)
    with _places(across) as (at_router, at_prefill, at_decode):
        try:
            yield from _fleet(sup, secured, model, prefill_tp, decode_tp, at_router, at_prefill, at_decode)
        finally:
            sup.stop()


def _fleet(sup, secured, model, prefill_tp, decode_tp, at_router, at_prefill, at_decode):
    decode = sup.spawn("decode", ["decode", "--host", at_decode.address, "--port", "0", "--model", str(model),
                                  *FLAGS, "--tensor-parallel-size", str(decode_tp), *secured],
                       launcher=tuple(at_decode.launcher()))
    prefill = sup.spawn("prefill", ["prefill", "--host", at_prefill.address, "--port", "0", "--model", str(model),
                                    *FLAGS, "--tensor-parallel-size", str(prefill_tp), *secured],
                        launcher=tuple(at_prefill.launcher()))
    addresses = {"decode": f"{at_decode.address}:{sup.wait_ready(decode, 240)}",
                 "prefill": f"{at_prefill.address}:{sup.wait_ready(prefill, 240)}"}
    router = sup.spawn("router", ["router", "--host", at_router.address, "--port", "0", "--model", str(model),
                                  "--kv-timeout", "10", "--prefill-workers", addresses["prefill"],
                                  "--decode-workers", addresses["decode"], "--wait-for-worker-s", "1",
                                  "--canary-interval-s", "0", *secured],  # its bytes are counted exactly
                       launcher=tuple(at_router.launcher()))
    target = f"{at_router.address}:{sup.wait_ready(router, 240)}"
    wait_serving(target, 60)
    with Client(target, ClientOptions(timeout_s=120)) as client:
        yield sup, prefill, decode, addresses, client


def block_nbytes(model) -> int:
    """Bytes of one block of every KV head (float32)."""
    import json

    config = json.loads((model / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return config["num_hidden_layers"] * 2 * BLOCK * config["num_key_value_heads"] * head_dim * 4


@pytest.mark.parametrize("prefill_tp,decode_tp,across", [(2, 1, False), (1, 2, False), (2, 2, False), (2, 1, True)],
                         ids=["2-1", "1-2", "2-2", "2-1-three-hosts"])
def test_kv_across_layouts_equals_transformers_and_each_rank_moves_its_share(tiny_model_dirs, prefill_tp,
                                                                             decode_tp, across):
    """`across`: router, prefill and decode each on a test host of its own (every prefill rank
    sends its heads over the network path)."""
    from transformers import AutoModelForCausalLM

    model = tiny_model_dirs["qwen2_bias"]
    reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    with fleet(model, prefill_tp, decode_tp, across) as (_, _, _, addresses, client):
        for prompt in PROMPTS:
            out = client.generate(token_ids=prompt, max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
            assert list(out.token_ids) == hf_greedy(reference, prompt, NEW_TOKENS)
        total = sum(-(-len(p) // BLOCK) for p in PROMPTS) * block_nbytes(model)
        sent = list(worker_stats(addresses["prefill"], "prefill").kv_rank_bytes)
        received = list(worker_stats(addresses["decode"], "decode").kv_rank_bytes)
        assert sent == [total // prefill_tp] * prefill_tp
        assert received == [total // decode_tp] * decode_tp
        wait_no_active_blocks(addresses)
