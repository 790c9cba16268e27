"""A colocated decode worker at tensor parallel size 2 behind a router: greedy outputs through
the service equal transformers; its follower rank killed mid-request, the request ends with a
status, the worker leaves with its engine-failure code and no rank is left running."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from pdserve.cli.services import EXIT_ENGINE_FAILED
from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions, PdserveError
from pdserve.procs.health import wait_serving
from tests.helpers.cluster import cluster_flags
from tests.helpers.reference import hf_greedy
from tests.helpers.waiting import wait_until
from tests.parallel.procs import alive, children

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
PROMPTS = [[1, 5, 17, 33, 2, 9], [1, *range(3, 40)]]
NEW_TOKENS = 10


@pytest.fixture()
def fleet(tiny_model_dirs):
    tiny = tiny_model_dirs["qwen2_bias"]
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    secured = cluster_flags(sup.workdir)
    try:
        decode = sup.spawn("decode", ["decode", "--port", "0", "--model", str(tiny), "--threads", "1",
                                      "--kv-blocks", "128", "--host-kv-blocks", "0", "--token-budget", "256",
                                      "--max-chunk-tokens", "16", "--tensor-parallel-size", "2", *secured])
        d_port = sup.wait_ready(decode, 240)
        router = sup.spawn("router", ["router", "--port", "0", "--colocated", "--model", str(tiny),
                                      "--decode-workers", f"127.0.0.1:{d_port}", "--wait-for-worker-s", "1",
                                      *secured])
        address = f"127.0.0.1:{sup.wait_ready(router, 240)}"
        wait_serving(address, 60)
        with Client(address, ClientOptions(timeout_s=120)) as client:
            yield tiny, sup, decode, client
    finally:
        sup.stop()


def test_colocated_tp2_worker_equals_transformers_and_fails_as_one(fleet):
    from transformers import AutoModelForCausalLM

    tiny, sup, decode, client = fleet
    reference = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    for prompt in PROMPTS:
        out = client.generate(token_ids=prompt, max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
        assert list(out.token_ids) == hf_greedy(reference, prompt, NEW_TOKENS)

    followers = children(decode.pid)
    assert len(followers) == 1 and alive(followers[0])
    killer = threading.Timer(1.0, os.kill, (followers[0], signal.SIGKILL))
    killer.start()
    try:
        with pytest.raises(PdserveError) as failed:
            client.generate(token_ids=PROMPTS[1], max_tokens=400, temperature=0, ignore_eos=True)
    finally:
        killer.cancel()
    assert failed.value.code in ("UNAVAILABLE", "INTERNAL", "ABORTED", "DEADLINE_EXCEEDED")
    assert sup.wait_exit(decode, 30) == EXIT_ENGINE_FAILED
    wait_until(lambda: not any(alive(p) for p in followers), 15, "every rank exits")
