"""Admission by predicted time to first token, on real processes: a second router over the session's
workers, with an objective no prompt can meet, refuses at its gRPC door with RESOURCE_EXHAUSTED and
a retry hint, and at its HTTP door with 429 and Retry-After (streamed or not), reserving nothing;
the session's own router (no objective) serves the same prompt. (tests/e2e/test_observability.py
reads the prediction in the trace and the metrics.)"""

from __future__ import annotations

import openai
import pytest

from pdserve.client import Client, ClientOptions, PdserveError
from pdserve.procs.health import wait_serving
from tests.helpers.cluster import cluster_flags
from tests.helpers.worker_stats import wait_no_active_blocks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PROMPT = "Name three rivers of Europe."


@pytest.fixture(scope="module")
def strict(service):
    sup = service["sup"]
    router = sup.spawn("router-strict", ["router", "--port", "0", "--prefill-workers", service["prefill"],
                                         "--decode-workers", service["decode"], "--http-port", "0",
                                         "--ttft-objective", "normal=0.000001,vip=0.000001",
                                         *cluster_flags(sup.workdir)])
    target = f"127.0.0.1:{sup.wait_ready(router, 240)}"
    wait_serving(target, 60)
    return {"target": target, "http": f"http://127.0.0.1:{router.http_port}"}


def test_grpc_refuses_with_resource_exhausted_and_a_retry_hint(service, strict):
    with Client(strict["target"], ClientOptions(timeout_s=60)) as client:
        with pytest.raises(PdserveError) as refused:
            client.generate(PROMPT, max_tokens=4, temperature=0)
    assert refused.value.code == "RESOURCE_EXHAUSTED"
    assert "predicted" in refused.value.details and "objective" in refused.value.details
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 1.0
    wait_no_active_blocks(service)


@pytest.mark.parametrize("stream", [False, True])
def test_http_refuses_with_429_and_retry_after(strict, stream):
    with openai.OpenAI(base_url=f"{strict['http']}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        model = client.models.list().data[0].id
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=4, temperature=0, stream=stream)
    assert int(refused.value.response.headers["retry-after"]) >= 1
    assert "predicted" in refused.value.message


def test_the_router_without_objectives_serves_the_same_prompt(service):
    with Client(service["target"], ClientOptions(timeout_s=120)) as client:
        completion = client.generate(PROMPT, max_tokens=4, temperature=0)
    assert len(completion.token_ids) == 4
