"""A third-party client, grpcurl, uses the real service through server reflection alone."""

from __future__ import annotations

import grpc
import pytest

from tests.helpers.grpcurl import Grpcurl, grpcurl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

GENERATE = "pdserve.v1.Generation/Generate"
PROMPT = "The capital of France is"
GRPCURL_EXIT_BASE = 64  # grpcurl exits 64 + the status code of a failed call


@pytest.fixture()
def cli(service) -> Grpcurl:
    return grpcurl(service["target"])


def test_list_shows_the_generation_and_health_services(cli):
    result = cli.run("list")
    assert result.returncode == 0, result.stderr
    assert {"pdserve.v1.Generation", "grpc.health.v1.Health"} <= set(result.lines())
    methods = cli.run("list", "pdserve.v1.Generation")
    assert {"pdserve.v1.Generation.Generate", "pdserve.v1.Generation.Abort"} <= set(methods.lines())


def test_describe_shows_the_request_message_and_the_streaming_method(cli):
    message = cli.run("describe", "pdserve.v1.GenerateRequest")
    assert message.returncode == 0, message.stderr
    assert "pdserve.v1.GenerateRequest is a message" in message.stdout
    for field in ("string request_id = 1;", ".pdserve.v1.SamplingParams sampling = 5;", "oneof prompt"):
        assert field in message.stdout, field
    service = cli.run("describe", "pdserve.v1.Generation")
    assert "returns ( stream .pdserve.v1.GenerateResponse )" in service.stdout


# grpcurl 1.8.6 prints the proto field names (token_ids), not protojson's camelCase.
def test_generate_streams_json_with_the_tokens_a_python_client_gets(cli, client):
    result = cli.run(GENERATE, data={"text": PROMPT, "sampling": {"max_tokens": 5, "temperature": 0}})
    assert result.returncode == 0, result.stderr
    messages = result.messages()
    reference = client.generate(PROMPT, max_tokens=5, temperature=0)
    assert len(messages) >= 2  # streamed: at least one token message and the final one
    tokens = [t for m in messages for t in m.get("token_ids", [])]
    assert len(tokens) == 5
    assert tokens == reference.token_ids
    assert "".join(m.get("text", "") for m in messages) == reference.text
    assert messages[-1]["finish_reason"] == "FINISH_REASON_LENGTH"
    assert messages[-1]["usage"]["completion_tokens"] == 5
    assert all("finish_reason" not in m for m in messages[:-1])


@pytest.mark.parametrize("service_name", ["", "pdserve.v1.Generation"])
def test_health_check_says_serving(cli, service_name):
    result = cli.run("grpc.health.v1.Health/Check", data={"service": service_name})
    assert result.returncode == 0, result.stderr
    assert result.messages() == [{"status": "SERVING"}]


# Also what pdserve.client refuses to send: no prompt at all, a priority outside the enum.
@pytest.mark.parametrize(("request_", "message"), [
    ({"text": ""}, "the prompt is empty"),
    ({"messages": {"messages": [{"role": "hacker", "content": "hi"}]}}, "chat message 0 has role 'hacker'"),
    ({"sampling": {"max_tokens": 2}}, "no prompt"),
    ({"text": "hi", "priority": 7}, "unknown priority value 7"),
], ids=["empty-prompt", "unknown-role", "no-prompt", "unknown-priority"])
def test_an_invalid_request_exits_non_zero_with_invalid_argument(cli, request_, message):
    result = cli.run(GENERATE, data=request_)
    assert result.returncode == GRPCURL_EXIT_BASE + grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "Code: InvalidArgument" in result.stderr
    assert message in result.stderr
    assert result.messages() == []
