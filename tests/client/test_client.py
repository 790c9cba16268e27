"""pdserve.client against an in-process fake of the router: what goes on the wire and what comes back."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.client import AsyncClient, Client, ClientOptions, PdserveError
from tests.client.fake_router import FakeRouter

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def router():
    with FakeRouter() as fake:
        yield fake


def test_generate_collects_tokens_text_usage_and_timings(router):
    with Client(router.target) as client:
        answer = client.generate("count", max_tokens=4, request_id="r-1")
    assert answer.token_ids == [0, 1, 2, 3] and answer.text == "0 1 2 3 " and answer.request_id == "r-1"
    assert answer.finish_reason == "length" and answer.usage.completion_tokens == 4
    assert answer.timings.ttft_s > 0 and len(answer.timings.gaps_s) == 3
    assert router.last_call().request.sampling.max_tokens == 4


def test_a_stream_is_sent_before_it_is_read_and_cancel_ends_the_call(router):
    with Client(router.target) as client:
        stream = client.stream("hold", max_tokens=8)
        seen = router.last_call()
        assert not seen.ended.is_set()
        assert next(stream).token_ids == (1,)
        stream.cancel()
        assert seen.ended.wait(10)
        with pytest.raises(PdserveError) as err:
            next(stream)
    assert err.value.code == "CANCELLED"


def test_leaving_a_with_block_cancels_the_stream(router):
    with Client(router.target) as client:
        with client.stream("hold") as stream:
            next(stream)
        assert router.last_call().ended.wait(10)


def test_dropping_a_stream_unread_cancels_it(router):
    with Client(router.target) as client:
        stream = client.stream("hold")
        seen = router.last_call()
        del stream
        assert seen.ended.wait(10)


def test_a_calls_own_deadline_overrides_the_options(router):
    with Client(router.target, ClientOptions(timeout_s=60)) as client:
        with pytest.raises(PdserveError) as err:
            client.generate("hold", timeout_s=0.2)
    assert err.value.code == "DEADLINE_EXCEEDED"


def test_errors_are_typed_and_bad_arguments_never_leave_the_client(router):
    with Client(router.target) as client:
        with pytest.raises(PdserveError) as err:
            client.generate("bad")
        assert (err.value.code, err.value.details) == ("INVALID_ARGUMENT", "a bad prompt")
        for bad in ({}, {"prompt": "a", "token_ids": [1]}, {"prompt": "a", "priority": "urgent"}):
            with pytest.raises(ValueError):
                client.stream(**bad)
        with pytest.raises(TypeError):
            client.stream("a", colour="red")
        assert client.abort("running") is True and client.abort("nobody") is False
    assert len(router.service.calls) == 1


def test_the_token_and_the_callers_trace_context_travel_as_metadata(router):
    from opentelemetry import context, trace

    span = trace.NonRecordingSpan(trace.SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331,
                                                    is_remote=True, trace_flags=trace.TraceFlags(1)))
    attached = context.attach(trace.set_span_in_context(span))
    try:
        with Client(router.target, ClientOptions(token="secret")) as client:
            client.generate("count", max_tokens=1)
    finally:
        context.detach(attached)
    metadata = router.last_call().metadata
    assert metadata["authorization"] == "Bearer secret"
    assert metadata["traceparent"] == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_the_async_stream_is_sent_at_once_and_cancels(router):
    async def run():
        async with AsyncClient(router.target) as client:
            whole = await client.generate("count", max_tokens=3)
            stream = client.stream("hold")
            first = await anext(stream)
            stream.cancel()
            with pytest.raises(PdserveError) as err:
                await anext(stream)
            return whole, first, err.value.code

    whole, first, code = asyncio.run(run())
    assert whole.token_ids == [0, 1, 2] and whole.finish_reason == "length"
    assert first.token_ids == (1,) and code == "CANCELLED"
    assert router.last_call().ended.wait(10)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_given_several_routers_a_stream_goes_on_at_the_next_after_the_tokens_it_has(asynchronous):
    with FakeRouter(dies_after=3) as dying, FakeRouter() as other:
        if asynchronous:
            async def main():
                async with AsyncClient([dying.target, other.target]) as client:
                    return await client.generate("count", max_tokens=8)

            answer = asyncio.run(main())
        else:
            with Client(f"{dying.target},{other.target}") as client:
                answer = client.generate("count", max_tokens=8)
        first, then = dying.last_call().request, other.last_call().request
    assert answer.token_ids == list(range(8)) and answer.finish_reason == "length"
    assert first.request_id and then.request_id == first.request_id  # an id it is continued by
    assert not first.HasField("resume_from_token")
    assert then.resume_from_token == 3 and list(then.prior_token_ids) == [0, 1, 2]


def test_with_one_router_a_stream_whose_router_went_away_fails_unavailable():
    with FakeRouter(dies_after=3) as dying, Client(dying.target) as client:
        with pytest.raises(PdserveError) as failed:
            client.generate("count", max_tokens=8)
    assert failed.value.code == "UNAVAILABLE" and len(dying.service.calls) == 1
