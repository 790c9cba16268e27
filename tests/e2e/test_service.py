"""The disaggregated service end to end: router -> prefill -> KV over UCX -> decode -> client."""

from __future__ import annotations

import concurrent.futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.helpers.streams import stream
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc
from tests.helpers.worker_stats import wait_no_active_blocks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PROMPTS = ["The capital of France is", "Once upon a time, in a small village by the sea,",
           " ".join(["The service moves KV cache blocks from prefill to decode workers."] * 12)]


@pytest.fixture(scope="module")
def reference():
    """Greedy ids from the in-process engine (itself checked token for token against transformers)."""
    from pdserve.config import EngineConfig
    from pdserve.engine.llm import LLM
    from pdserve.requests import SamplingParams

    llm = LLM(EngineConfig())
    return [c.token_ids for c in llm.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))]


def _greedy(text: str, max_tokens: int = 16) -> pb.GenerateRequest:
    return pb.GenerateRequest(text=text, sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0,
                                                                    ignore_eos=True))


def test_greedy_outputs_equal_the_reference(channel, reference):
    stub = generation_pb2_grpc.GenerationStub(channel)
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: stream(stub, _greedy(p), timeout=120), PROMPTS))
    for result, expected in zip(results, reference):
        assert tuple(result.token_ids) == tuple(expected)
        assert result.finish_reason == "FINISH_REASON_LENGTH"
        assert result.usage.completion_tokens == 16


def test_chat_and_token_id_prompts(channel):
    stub = generation_pb2_grpc.GenerationStub(channel)
    chat = pb.GenerateRequest(sampling=pb.SamplingParams(max_tokens=20, temperature=0))
    chat.messages.messages.add(role="user", content="What is the capital of France?")
    result = stream(stub, chat, timeout=120)
    assert "Paris" in result.text
    assert result.finish_reason == "FINISH_REASON_STOP"
    ids = pb.GenerateRequest(token_ids=pb.TokenIds(ids=result.token_ids[:3]), sampling=pb.SamplingParams(max_tokens=2))
    assert len(stream(stub, ids, timeout=120).token_ids) == 2


def test_stop_string_ends_the_stream_before_it(channel):
    stub = generation_pb2_grpc.GenerationStub(channel)
    request = _greedy("The capital of France is", 16)
    request.sampling.stop.append(".")
    result = stream(stub, request, timeout=120)
    assert result.finish_reason == "FINISH_REASON_STOP"
    assert "." not in result.text and "Paris" in result.text


BAD = {
    "no prompt": pb.GenerateRequest(),
    "empty prompt": pb.GenerateRequest(text=""),
    "token outside vocab": pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 10_000_000])),
    "too long": pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5] * 8000), sampling=pb.SamplingParams(max_tokens=500)),
    "max_tokens 0": pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(max_tokens=0)),
    "temperature < 0": pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(temperature=-1)),
    "top_p 0": pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(top_p=0)),
    "top_p > 1": pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(top_p=1.5)),
    "top_k < 0": pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(top_k=-2)),
    "min_p > 1": pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(min_p=2)),
    "unknown priority": pb.GenerateRequest(text="hi", priority=7),
    "chat message without role": pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(content="x")])),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_gets_invalid_argument_and_service_goes_on(channel, name):
    stub = generation_pb2_grpc.GenerationStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(BAD[name], timeout=60))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert err.value.details()
    assert len(stream(stub, _greedy("Hello", 2), timeout=120).token_ids) == 2


def test_duplicate_running_request_id_is_already_exists(channel):
    stub = generation_pb2_grpc.GenerationStub(channel)
    first = _greedy("Count slowly from one to fifty:", 60)
    first.request_id = "dup-1"
    call = stub.Generate(first, timeout=120)
    next(call)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(first, timeout=60))
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    call.cancel()


def test_abort_and_cancel_free_every_block(service, channel):
    stub = generation_pb2_grpc.GenerationStub(channel)
    request = _greedy("Write a long story about a lighthouse keeper.", 200)
    request.request_id = "to-abort"
    call = stub.Generate(request, timeout=120)
    next(call)
    assert stub.Abort(pb.AbortRequest(request_id="to-abort")).found
    last = list(call)[-1]
    assert last.finish_reason == pb.FINISH_REASON_ABORT
    for i in range(6):
        cancelled = stub.Generate(_greedy(f"Tell me about the number {i}.", 200), timeout=120)
        if i % 2:
            next(cancelled)
        cancelled.cancel()
    wait_no_active_blocks(service)


def test_health_and_reflection(channel):
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(service="")).status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert "pdserve.v1.Generation" in names and "grpc.health.v1.Health" in names
