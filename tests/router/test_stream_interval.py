"""The router's --stream-interval through the gateway (both doors' one path) over fake workers:
a client gets the same tokens, text, finish and usage with and without it, in messages of at
least N tokens after the first; with n samples, per sample; a stop string ends the request at
the same token whatever the grouping."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from pdserve.requests import SamplingParams
from pdserve.rpc.drain import Drain
from pdserve.tokenizer import load_tokenizer
from pdserve.validation import Limits
from router.doors.asks import Ask, Output, SampleCount, TokenPrompt, sizes_of
from router.doors.frontend import Frontend
from router.doors.gateway import Gateway
from router.doors.http.app import HttpApi, HttpSettings
from router.flow.flow_types import NewTokens
from router.doors.stream_interval import StreamInterval
from tests.router.fake_trace import FakeTrace
from tests.router.flow_harness import PROMPT, expected, harness

pytestmark = pytest.mark.timeout(120)
TOKENS = 48
EVERY_4 = StreamInterval(tokens=4)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


class _Source:
    """An Ask as the gateway's AskSource, as a door hands one over."""

    def __init__(self, ask: Ask):
        self._ask = ask

    def sizes(self):
        return sizes_of(self._ask)

    def ask(self) -> Ask:
        return self._ask


def _with_gateway(tokenizer, interval: StreamInterval, body, traces: list[FakeTrace] | None = None,
                  held: bool = False, **flow_kw):
    """`body(gateway)`, or with `held` `body(gateway, fleet)` whose decode workers hold every
    reservation until the body lets them go."""
    made = [] if traces is None else traces

    def trace(metadata) -> FakeTrace:
        made.append(FakeTrace())
        return made[-1]

    async def main():
        async with harness(**flow_kw) as h:
            frontend = Frontend(tokenizer, Limits(49152, 8192))
            gateway = Gateway(frontend, h.flow, trace, Drain(), interval=interval)
            try:
                if not held:
                    return await body(gateway)
                for worker in h.fleet.workers.values():
                    worker.reserving.clear()
                return await body(gateway, h.fleet)
            finally:
                frontend.close()

    return asyncio.run(main())


def _serve(tokenizer, interval: StreamInterval, ask: Ask, traces: list[FakeTrace] | None = None,
           **flow_kw) -> list[Output]:
    async def body(gateway: Gateway) -> list[Output]:
        generation = await gateway.admit((), _Source(ask), None)
        return [output async for output in gateway.stream(generation)]

    return _with_gateway(tokenizer, interval, body, traces, **flow_kw)


def _sse_chunks(tokenizer, interval: StreamInterval) -> list[dict]:
    """/v1/completions, streamed, as its chunks (the HTTP door)."""
    async def body(gateway: Gateway) -> list[dict]:
        api = HttpApi(gateway, HttpSettings("fake", 8192, 1 << 20), str, lambda: True, lambda: b"")
        async with TestClient(TestServer(api.application())) as client:
            response = await client.post("/v1/completions", json={
                "model": "fake", "prompt": list(PROMPT), "max_tokens": TOKENS, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}})
            lines = [line for line in (await response.text()).splitlines() if line.startswith("data: ")]
        return [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]

    return _with_gateway(tokenizer, interval, body)


def _ask(max_tokens: int = TOKENS, n: int = 1, stop: tuple[str, ...] = ()) -> Ask:
    return Ask(TokenPrompt(PROMPT), SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=stop),
               count=SampleCount(n))


def _whole(outputs: list[Output], index: int = 0) -> tuple:
    """What the client got for one sample: its tokens, text, finish."""
    mine = [o for o in outputs if o.index == index]
    return ([t for o in mine for t in o.token_ids], "".join(o.text for o in mine), mine[-1].finish)


def _token_messages(outputs: list[Output], index: int = 0) -> list[tuple[int, ...]]:
    """The token ids of each message but the last (the finish, which sends what is held)."""
    return [o.token_ids for o in outputs if o.index == index][:-1]


def test_the_interval_groups_tokens_and_the_client_gets_the_same_output(tokenizer):
    plain, traces = _serve(tokenizer, StreamInterval(), _ask()), []
    grouped = _serve(tokenizer, EVERY_4, _ask(), traces)
    assert _whole(grouped) == _whole(plain)
    arrived = [e.token_ids for e in traces[0].events if isinstance(e, NewTokens)]  # as they came, not as sent
    assert [t for ids in arrived for t in ids] == _whole(plain)[0]
    assert _whole(grouped)[0] == expected(max_tokens=TOKENS)
    messages = _token_messages(grouped)
    assert messages[0] and all(len(ids) >= EVERY_4.tokens for ids in messages[1:] if ids)
    assert len(grouped) <= TOKENS // EVERY_4.tokens + 3  # first, groups, the rest and the finish


def test_token_events_gathered_in_the_relay_give_the_same_messages_and_every_step_to_the_trace(tokenizer):
    paced, traces = _serve(tokenizer, EVERY_4, _ask()), []
    gathered = _serve(tokenizer, EVERY_4, _ask(n=1), traces, gather_tokens=EVERY_4.gather_tokens)
    assert _whole(gathered) == _whole(paced)
    assert [len(ids) for ids in _token_messages(gathered)] == [len(ids) for ids in _token_messages(paced)]
    events = [e for e in traces[0].events if isinstance(e, NewTokens)]
    steps = [n for e in events for _, n in e.arrived or ((0.0, len(e.token_ids)),)]
    assert sum(steps) == TOKENS and len(steps) > len(events)  # a step each, fewer wake-ups


def test_an_abort_while_tokens_are_gathered_ends_with_exactly_the_tokens_the_client_got(tokenizer):
    """Whether tokens were gathered at the abort depends on timing: what holds either way is that
    the client's tokens are the request's, in order, and the usage counts exactly them."""
    async def body(gateway: Gateway) -> list[Output]:
        generation = await gateway.admit((), _Source(dataclasses.replace(_ask(max_tokens=200), request_id="r")),
                                         None)
        outputs = []
        async for output in gateway.stream(generation):
            outputs.append(output)
            if len(outputs) == 3:
                for _ in range(7):  # tokens come by the flow meanwhile, some gathered
                    await asyncio.sleep(0.002)
                await gateway.abort((), "r")
        return outputs

    outputs = _with_gateway(tokenizer, EVERY_4, body, gather_tokens=EVERY_4.gather_tokens)
    tokens, _, finish = _whole(outputs)
    assert finish.reason.name == "ABORT" and finish.usage.completion_tokens == len(tokens)
    assert tokens == expected(max_tokens=len(tokens))


def test_n_samples_are_grouped_each_on_its_own(tokenizer):
    plain = _serve(tokenizer, StreamInterval(), _ask(n=2))
    grouped = _serve(tokenizer, EVERY_4, _ask(n=2))
    for index in (0, 1):
        assert _whole(grouped, index) == _whole(plain, index)
        assert all(len(ids) >= EVERY_4.tokens for ids in _token_messages(grouped, index)[1:] if ids)


def test_a_stop_string_ends_at_the_same_token_whatever_the_grouping(tokenizer):
    whole_text = _whole(_serve(tokenizer, StreamInterval(), _ask()))[1]
    stop = whole_text[len(whole_text) // 2:len(whole_text) // 2 + 3]
    assert stop.strip(), whole_text
    plain = _serve(tokenizer, StreamInterval(), _ask(stop=(stop,)))
    grouped = _serve(tokenizer, EVERY_4, _ask(stop=(stop,)))
    assert _whole(grouped)[1] == _whole(plain)[1] == whole_text[:whole_text.index(stop)]
    assert _whole(grouped)[:2] == _whole(plain)[:2]
    tokens, _, finish = _whole(grouped)
    assert finish.reason.name == "STOP" and finish.usage.completion_tokens == len(tokens) < TOKENS
    assert dataclasses.replace(finish.usage) == _whole(plain)[2].usage


def test_the_http_door_streams_the_same_text_in_fewer_chunks(tokenizer):
    plain, grouped = _sse_chunks(tokenizer, StreamInterval()), _sse_chunks(tokenizer, EVERY_4)

    def whole(chunks):
        choices = [c["choices"][0] for c in chunks if c["choices"]]
        return "".join(c["text"] for c in choices), choices[-1]["finish_reason"], chunks[-1]["usage"]

    assert whole(grouped) == whole(plain)
    assert whole(grouped)[2]["completion_tokens"] == TOKENS
    assert len(grouped) <= TOKENS // EVERY_4.tokens + 3  # first, groups, the rest with the finish, usage


def test_a_stream_without_a_first_output_gets_its_headers_and_pings_before_it(tokenizer):
    """The decode workers hold every reservation: the client has its 200 and an SSE comment while no
    token exists, then the whole stream once they let go (a long prefill is no silent connection)."""
    async def body(gateway: Gateway, fleet) -> tuple[int, bytes, list[dict]]:
        settings = HttpSettings("fake", 8192, 1 << 20, headers_after_s=0.0, ping_s=0.05)
        api = HttpApi(gateway, settings, str, lambda: True, lambda: b"")
        async with TestClient(TestServer(api.application())) as client:
            response = await asyncio.wait_for(client.post("/v1/completions", json={
                "model": "fake", "prompt": list(PROMPT), "max_tokens": TOKENS, "temperature": 0, "stream": True}), 30)
            before = await asyncio.wait_for(response.content.readuntil(b"\r\n\r\n"), 30)
            for worker in fleet.workers.values():
                worker.reserving.set()
            lines = [line for line in (await response.text()).splitlines() if line.startswith("data: {")]
        return response.status, before, [json.loads(line[6:]) for line in lines]

    status, before, chunks = _with_gateway(tokenizer, StreamInterval(), body, held=True)
    assert status == 200 and before.startswith(b": ping")
    assert "".join(c["choices"][0]["text"] for c in chunks) == tokenizer.decode(expected(max_tokens=TOKENS))


def test_a_stream_that_fails_after_its_headers_ends_with_the_error_as_its_last_event(tokenizer):
    """Headers out, no token yet, then every decode worker dies: the failure is the stream's last
    event (its status is gone with the headers), then [DONE]."""
    async def body(gateway: Gateway, fleet) -> tuple[int, list[str]]:
        settings = HttpSettings("fake", 8192, 1 << 20, headers_after_s=0.0, ping_s=0.05)
        api = HttpApi(gateway, settings, str, lambda: True, lambda: b"")
        async with TestClient(TestServer(api.application())) as client:
            response = await asyncio.wait_for(client.post("/v1/completions", json={
                "model": "fake", "prompt": list(PROMPT), "max_tokens": TOKENS, "temperature": 0, "stream": True}), 30)
            await asyncio.wait_for(response.content.readuntil(b"\r\n\r\n"), 30)
            for worker in fleet.workers.values():
                worker.kill()
            data = [line[6:] for line in (await response.text()).splitlines() if line.startswith("data: ")]
        return response.status, data

    status, data = _with_gateway(tokenizer, StreamInterval(), body, held=True, wait_for_worker_s=0.2)
    assert status == 200 and data[-1] == "[DONE]"
    assert "error" in json.loads(data[-2]) and not any("choices" in json.loads(d) for d in data[:-2])
