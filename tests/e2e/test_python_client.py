"""pdserve.client, sync and asyncio, against the real service."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.client import AsyncClient, Client, Message, PdserveError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def client(service):
    with Client(service["target"]) as c:
        yield c


def test_generate_returns_typed_text_tokens_usage_and_timings(client):
    answer = client.generate(messages=[Message("user", "Name a colour.")], max_tokens=12, temperature=0,
                             ignore_eos=True)
    assert answer.finish_reason == "length" and len(answer.token_ids) == 12 == answer.usage.completion_tokens
    assert answer.text and answer.request_id and answer.timings.ttft_s > 0 and len(answer.timings.gaps_s) >= 1
    again = client.generate(messages=[{"role": "user", "content": "Name a colour."}], max_tokens=12, temperature=0,
                            ignore_eos=True)
    assert again.token_ids == answer.token_ids


def test_stream_text_and_token_ids_prompts(client):
    chunks = list(client.stream("The capital of France is", max_tokens=6, temperature=0, stop=["\n\n"]))
    assert chunks[-1].finish_reason in ("stop", "length") and chunks[-1].usage.prompt_tokens > 0
    by_ids = client.generate(token_ids=[504, 3575, 282], max_tokens=4, temperature=0)
    assert by_ids.usage.prompt_tokens == 3


def test_errors_are_typed_and_health_is_a_bool(client):
    with pytest.raises(PdserveError) as err:
        client.generate(messages=[Message("hacker", "hi")])
    assert err.value.code == "INVALID_ARGUMENT" and "role" in err.value.details
    with pytest.raises(ValueError):
        client.generate("a", token_ids=[1])
    with pytest.raises(TypeError):
        client.generate("a", colour="red")
    assert client.health() is True
    assert client.abort("nobody-runs-this") is False


def test_the_async_client(service):
    async def run():
        async with AsyncClient(service["target"]) as c:
            whole = await c.generate("Once upon a time", max_tokens=8, temperature=0)
            streamed = [chunk.text async for chunk in c.stream("Once upon a time", max_tokens=8, temperature=0)]
            return whole, "".join(streamed), await c.health()

    whole, streamed, healthy = asyncio.run(run())
    assert whole.text == streamed and healthy
