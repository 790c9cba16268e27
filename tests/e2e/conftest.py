"""Real service processes on loopback: one decode worker, one prefill worker, one router."""

from __future__ import annotations

import os

import grpc
import pytest

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions
from pdserve.procs.health import wait_serving
from tests.helpers.cluster import cluster_flags

WORKER_FLAGS = ["--kv-blocks", "192", "--host-kv-blocks", "128", "--threads", "1", "--token-budget", "256",
                "--max-chunk-tokens", "64"]
CALL_TIMEOUT_S = 120.0


@pytest.fixture(scope="session")
def service():
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    secured = cluster_flags(sup.workdir)
    try:
        decode = sup.spawn("decode", ["decode", "--port", "0", *WORKER_FLAGS, *secured])
        prefill = sup.spawn("prefill", ["prefill", "--port", "0", *WORKER_FLAGS, *secured])
        d_port, p_port = sup.wait_ready(decode, 240), sup.wait_ready(prefill, 240)
        router = sup.spawn("router", ["router", "--port", "0", "--prefill-workers", f"127.0.0.1:{p_port}",
                                      "--decode-workers", f"127.0.0.1:{d_port}", "--kv-timeout", "10",
                                      "--http-port", "0", *secured])
        target = f"127.0.0.1:{sup.wait_ready(router, 240)}"
        wait_serving(target, 60)
        yield {"target": target, "decode": f"127.0.0.1:{d_port}", "prefill": f"127.0.0.1:{p_port}", "sup": sup,
               "router": router, "http": f"http://127.0.0.1:{router.http_port}"}
    finally:
        sup.stop()


@pytest.fixture(scope="session")
def reference_llm():
    """One in-process engine on the embedded model for every test's expected outputs (itself checked
    token for token against transformers): one torch thread, as the workers run, so it never
    oversubscribes the cores the service processes share, and a small KV pool."""
    import torch

    from pdserve.config import CacheConfig, EngineConfig
    from pdserve.engine.llm import LLM

    torch.set_num_threads(1)
    llm = LLM(EngineConfig(cache=CacheConfig(num_blocks=256, num_host_blocks=16)))
    yield llm
    llm.close()


@pytest.fixture()
def channel(service):
    with grpc.insecure_channel(service["target"]) as ch:
        yield ch


@pytest.fixture(scope="session")
def client(service):
    """pdserve.client on the service's router, each call with a deadline of CALL_TIMEOUT_S."""
    with Client(service["target"], ClientOptions(timeout_s=CALL_TIMEOUT_S)) as c:
        yield c


@pytest.fixture(scope="session")
def sdk(service):
    """The official openai client on the service's HTTP door."""
    import openai

    with openai.OpenAI(base_url=f"{service['http']}/v1", api_key="unused", max_retries=0, timeout=300) as c:
        yield c


@pytest.fixture(scope="session")
def model(sdk) -> str:
    """The name the service serves its model by."""
    return sdk.models.list().data[0].id
