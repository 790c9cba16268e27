"""The disaggregated service end to end: router -> prefill -> KV over UCX -> decode -> client."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from pdserve.client import PdserveError
from tests.helpers.worker_stats import wait_no_active_blocks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PROMPTS = ["The capital of France is", "Once upon a time, in a small village by the sea,",
           " ".join(["The service moves KV cache blocks from prefill to decode workers."] * 12)]


@pytest.fixture(scope="module")
def reference(reference_llm):
    """Greedy ids from the in-process engine (itself checked token for token against transformers)."""
    from pdserve.requests import SamplingParams

    return [c.token_ids for c in reference_llm.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=0,
                                                                                ignore_eos=True))]


GREEDY = {"temperature": 0, "ignore_eos": True}
HELD_TOKENS = 1000  # a stream the test acts on after its first token is still far from its end, at any decode speed


def test_greedy_outputs_equal_the_reference(client, reference):
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: client.generate(p, max_tokens=16, **GREEDY), PROMPTS))
    for result, expected in zip(results, reference):
        assert tuple(result.token_ids) == tuple(expected)
        assert result.finish_reason == "length"
        assert result.usage.completion_tokens == 16


def test_chat_and_token_id_prompts(client):
    result = client.generate(messages=[{"role": "user", "content": "What is the capital of France?"}],
                             max_tokens=20, temperature=0)
    assert "Paris" in result.text
    assert result.finish_reason == "stop"
    assert len(client.generate(token_ids=result.token_ids[:3], max_tokens=2).token_ids) == 2


def test_stop_string_ends_the_stream_before_it(client):
    result = client.generate("The capital of France is", max_tokens=16, stop=["."], **GREEDY)
    assert result.finish_reason == "stop"
    assert "." not in result.text and "Paris" in result.text


BAD = {  # requests no typed client refuses itself; those it cannot build are in test_grpcurl.py
    "empty prompt": {"prompt": ""},
    "token outside vocab": {"token_ids": [1, 10_000_000]},
    "too long": {"token_ids": [5] * 8000, "max_tokens": 500},
    "max_tokens 0": {"prompt": "hi", "max_tokens": 0},
    "temperature < 0": {"prompt": "hi", "temperature": -1},
    "top_p 0": {"prompt": "hi", "top_p": 0},
    "top_p > 1": {"prompt": "hi", "top_p": 1.5},
    "top_k < 0": {"prompt": "hi", "top_k": -2},
    "min_p > 1": {"prompt": "hi", "min_p": 2},
    "chat message without role": {"messages": [{"role": "", "content": "x"}]},
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_gets_invalid_argument_and_service_goes_on(client, name):
    with pytest.raises(PdserveError) as err:
        client.generate(**BAD[name])
    assert err.value.code == "INVALID_ARGUMENT", err.value.details
    assert err.value.details
    assert len(client.generate("Hello", max_tokens=2, **GREEDY).token_ids) == 2


def test_duplicate_running_request_id_is_already_exists(client):
    with client.stream("Count slowly from one to fifty:", max_tokens=HELD_TOKENS, request_id="dup-1",
                       **GREEDY) as first:
        next(first)
        with pytest.raises(PdserveError) as err:
            client.generate("Count slowly from one to fifty:", max_tokens=60, request_id="dup-1", **GREEDY)
    assert err.value.code == "ALREADY_EXISTS"


def test_abort_and_cancel_free_every_block(service, client):
    aborted = client.stream("Write a long story about a lighthouse keeper.", max_tokens=HELD_TOKENS,
                            request_id="to-abort", **GREEDY)
    next(aborted)
    assert client.abort("to-abort")
    assert aborted.collect().finish_reason == "abort"
    for i in range(6):
        cancelled = client.stream(f"Tell me about the number {i}.", max_tokens=200, **GREEDY)
        if i % 2:
            next(cancelled)
        cancelled.cancel()
    wait_no_active_blocks(service)


def test_health_and_reflection(client, channel):
    assert client.health()
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert "pdserve.v1.Generation" in names and "grpc.health.v1.Health" in names


def test_the_router_process_never_loads_torch(service, client):
    """The router routes: it reads the model's config and tokenizer, never its weights, so after
    serving a request no torch library is mapped into its process."""
    assert client.generate("The capital of France is", max_tokens=2, **GREEDY).token_ids
    maps = Path(f"/proc/{service['router'].process.pid}/maps").read_text()
    libraries = {line.rsplit("/", 1)[-1] for line in maps.splitlines() if ".so" in line}
    assert not {lib for lib in libraries if "torch" in lib}, sorted(libraries)
