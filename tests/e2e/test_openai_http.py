"""The OpenAI-compatible HTTP door against a real service, through clients nobody here wrote:
the official `openai` package (sync and async) and curl for the raw server-sent events."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess

import aiohttp
import openai
import pytest

from pdserve.client import Client, ClientOptions, Completion
from tests.helpers.worker_stats import wait_no_active_blocks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three rivers of Europe."}]


@pytest.fixture(scope="module")
def client(service):
    with openai.OpenAI(base_url=f"{service['http']}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def _grpc(service, prompt: str | None = None, **request) -> Completion:
    """The same request over the router's gRPC door."""
    with Client(service["target"], ClientOptions(timeout_s=120)) as grpc_client:
        return grpc_client.generate(prompt, **request)


def test_models_lists_the_served_model(client, model):
    assert model and [m.id for m in client.models.list().data] == [model]


def test_a_greedy_chat_equals_grpc_generate_token_for_token(service, client, model):
    reply = client.chat.completions.create(model=model, messages=CHAT, max_tokens=24, temperature=0)
    answer = _grpc(service, messages=CHAT, max_tokens=24, temperature=0)
    usage = answer.usage
    assert reply.choices[0].message.content == answer.text and reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (usage.prompt_tokens, usage.completion_tokens)
    assert reply.usage.completion_tokens == len(answer.token_ids)
    assert reply.usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_streaming_yields_the_same_text_and_usage(client, model):
    whole = client.chat.completions.create(model=model, messages=CHAT, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model=model, messages=CHAT, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1


def test_completions_take_text_and_token_ids(service, client, model):
    prompt = "The three primary colours are"
    text = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
    assert text.choices[0].text == _grpc(service, prompt, max_tokens=12, temperature=0).text
    prompt_ids = [504, 1462, 2314, 7201, 359]
    by_ids = client.completions.create(model=model, prompt=prompt_ids, max_tokens=8, temperature=0)
    expected = _grpc(service, token_ids=prompt_ids, max_tokens=8, temperature=0).text
    assert by_ids.choices[0].text == expected and by_ids.usage.prompt_tokens == len(prompt_ids)


def test_the_async_client_streams_too(service, model):
    async def run() -> tuple[str, str]:
        async with openai.AsyncOpenAI(base_url=f"{service['http']}/v1", api_key="unused", max_retries=0) as c:
            whole = await c.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0)
            stream = await c.completions.create(model=model, prompt="Once upon a time", max_tokens=16,
                                                temperature=0, stream=True)
            return whole.choices[0].text, "".join([chunk.choices[0].text async for chunk in stream])

    whole, streamed = asyncio.run(run())
    assert streamed == whole and whole


def test_stop_strings_and_seeds_behave_as_over_grpc(service, client, model):
    seeded = [client.completions.create(model=model, prompt="A list of fruit:", max_tokens=16, temperature=0.9,
                                        seed=7).choices[0].text for _ in range(2)]
    assert seeded[0] == seeded[1]
    stopped = client.completions.create(model=model, prompt="Count: one, two, three,", max_tokens=30, temperature=0,
                                        stop=[","])
    assert "," not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("kwargs,status,needle", [
    ({"messages": [{"role": "hacker", "content": "hi"}]}, 400, "role"),
    ({"messages": []}, 400, "messages"),
    ({"messages": CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": CHAT, "temperature": -1}, 400, "temperature"),
    ({"messages": CHAT, "n": 17}, 400, "n must be in"),
    ({"messages": CHAT, "top_p": "high"}, 400, "top_p"),
    ({"messages": CHAT, "stop": ["s"] * 17}, 400, "--max-stop-strings"),
    ({"messages": CHAT, "presence_penalty": 2.5}, 400, "presence_penalty"),
    ({"messages": CHAT, "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ({"messages": CHAT, "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ({"messages": CHAT, "model": "gpt-4o"}, 404, "does not exist"),
    ({"messages": CHAT, "priority": "vip"}, 403, "NORMAL"),
])
def test_bad_requests_get_openai_errors_and_the_service_keeps_serving(client, model, kwargs, status, needle):
    kwargs = {"model": model, **kwargs}
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(**{k: v for k, v in kwargs.items() if k not in ("priority",)},
                                       extra_body={"priority": kwargs["priority"]} if "priority" in kwargs else None)
    assert err.value.status_code == status and needle in err.value.message
    assert isinstance(err.value.body, dict) and err.value.body.get("type")
    assert client.completions.create(model=model, prompt="Hi", max_tokens=2, temperature=0).choices[0].text is not None


def test_priority_from_a_header_and_a_malformed_body(service):
    async def run():
        async with aiohttp.ClientSession() as http:
            url = f"{service['http']}/v1/completions"
            async with http.post(url, json={"prompt": "Hi", "max_tokens": 2}, headers={"x-pdserve-priority": "vip"}) as r:
                header = (r.status, await r.json())
            async with http.post(url, data=b"{not json", headers={"content-type": "application/json"}) as r:
                malformed = (r.status, await r.json())
            async with http.get(f"{service['http']}/health") as r:
                health = r.status
        return header, malformed, health

    header, malformed, health = asyncio.run(run())
    assert header[0] == 403 and header[1]["error"]["type"] == "permission_error"
    assert malformed[0] == 400 and "not JSON" in malformed[1]["error"]["message"]
    assert health == 200


def test_a_running_request_id_is_a_conflict(service, model):
    async def run():
        async with aiohttp.ClientSession() as http:
            url, headers = f"{service['http']}/v1/completions", {"x-request-id": "http-dup-1"}
            # still far from its end when the second arrives, at any decode speed
            body = {"model": model, "prompt": "Tell a long story.", "max_tokens": 1000, "ignore_eos": True,
                    "stream": True}
            async with http.post(url, json=body, headers=headers) as first:
                await first.content.readline()
                async with http.post(url, json={**body, "stream": False}, headers=headers) as second:
                    return second.status, await second.json()

    status, body = asyncio.run(run())
    assert status == 409 and "already running" in body["error"]["message"]
    wait_no_active_blocks(service)


def test_curl_sees_server_sent_events_framed_as_openai_does(service, model):
    assert shutil.which("curl"), "curl is needed for this test (it is on every machine this project runs on)"
    body = json.dumps({"model": model, "messages": CHAT, "max_tokens": 8, "temperature": 0, "stream": True})
    out = subprocess.run(["curl", "-sN", "-H", "content-type: application/json", "-d", body,
                          f"{service['http']}/v1/chat/completions"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    events = [dict(line.split(": ", 1) for line in e.split("\n")) for e in out.stdout.split("\n\n") if e.strip()]
    assert all(set(e) == {"id", "data"} for e in events), events[:3]
    assert events[-1]["data"] == "[DONE]"
    chunks = [json.loads(e["data"]) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    # every event's id: <request id>/<tokens sent so far> (what Last-Event-ID continues after)
    named, counts = {e["id"].rpartition("/")[0] for e in events}, [int(e["id"].rpartition("/")[2]) for e in events]
    assert len(named) == 1 and counts == sorted(counts) and 0 < counts[-1] <= 8


def test_clients_that_disconnect_mid_stream_leave_no_block_behind(service, model):
    async def one(http: aiohttp.ClientSession, i: int, rng: random.Random) -> None:
        body = {"model": model, "prompt": f"Story number {i}:", "max_tokens": 120, "ignore_eos": True, "stream": True}
        async with http.post(f"{service['http']}/v1/completions", json=body) as response:
            for _ in range(rng.randrange(0, 12)):
                if not await response.content.readline():
                    break
            response.close()  # drop the connection mid-stream

    async def run():
        rng = random.Random(5)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=50)) as http:
            await asyncio.gather(*(one(http, i, rng) for i in range(50)))

    asyncio.run(run())
    wait_no_active_blocks(service, timeout_s=60)


def test_a_held_out_chat_equals_transformers(client, model, embedded_gguf_path):
    """A prompt no other test uses, end to end through HTTP, against transformers' own greedy run."""
    from pdserve.tokenizer import ChatMessage, load_tokenizer
    from tests.engine.oracle import Oracle

    messages = [{"role": "user", "content": "Explain in one sentence why the sky looks blue at noon."}]
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=20, temperature=0,
                                           extra_body={"ignore_eos": True})
    tokenizer = load_tokenizer(None)
    prompt = tokenizer.apply_chat_template([ChatMessage(**m) for m in messages])
    expected = Oracle({"embedded": embedded_gguf_path}).greedy("embedded", prompt, 20)
    assert reply.usage.prompt_tokens == len(prompt) and reply.usage.completion_tokens == 20
    assert reply.choices[0].message.content == tokenizer.decode(expected)


def test_logprobs_through_both_endpoints_match_grpc(service, client, model):
    reply = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=0,
                                           logprobs=True, top_logprobs=3)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens == 8
    for entry in entries:
        assert len(entry.top_logprobs) == 3 and entry.logprob == max(t.logprob for t in entry.top_logprobs) <= 0
    assert "".join(e.token for e in entries) == reply.choices[0].message.content
    grpc_logprobs = [e.logprob for e in _grpc(service, messages=CHAT, max_tokens=8, temperature=0, logprobs=3).logprobs]
    assert [e.logprob for e in entries] == pytest.approx(grpc_logprobs, abs=1e-6)
    completion = client.completions.create(model=model, prompt="One, two, three,", max_tokens=5, temperature=0,
                                           logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    assert logprobs.text_offset[0] == 0 and all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert client.chat.completions.create(model=model, messages=CHAT, max_tokens=2).choices[0].logprobs is None


def test_biases_and_penalties_through_both_doors_equal_the_engine(service, client, model, reference_llm):
    """logit_bias, presence and frequency penalties (OpenAI's fields) and repetition_penalty and
    min_tokens (extra fields, as vLLM takes them): the prefill worker applies them to the first
    token, the decode worker to the rest, and both doors give what one in-process engine gives."""
    from pdserve.requests import SamplingParams

    prompt = "List the planets of the Solar System, one per line."
    plain = _grpc(service, prompt, max_tokens=24, temperature=0, ignore_eos=True)
    bias = {str(plain.token_ids[0]): -100.0, str(plain.token_ids[1]): 3.0}
    adjusted = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, presence_penalty=0.6,
                              frequency_penalty=0.8, repetition_penalty=1.3, min_tokens=4,
                              logit_bias=tuple(sorted((int(t), b) for t, b in bias.items())))
    expected = list(reference_llm.generate([prompt], adjusted)[0].token_ids)
    assert expected != list(plain.token_ids)  # the settings changed the answer
    over_grpc = _grpc(service, prompt, max_tokens=24, temperature=0, ignore_eos=True, presence_penalty=0.6,
                      frequency_penalty=0.8, repetition_penalty=1.3, min_tokens=4, logit_bias=bias)
    over_http = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0,
                                          presence_penalty=0.6, frequency_penalty=0.8, logit_bias=bias,
                                          extra_body={"repetition_penalty": 1.3, "min_tokens": 4, "ignore_eos": True})
    assert list(over_grpc.token_ids) == expected
    assert over_http.choices[0].text == reference_llm.tokenizer.decode(expected)


def test_echo_returns_the_prompt_before_the_completion(client, model):
    prompt = "The capital of Italy is"
    whole = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0, echo=True)
    plain = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0)
    assert whole.choices[0].text == prompt + plain.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt=prompt, max_tokens=4, temperature=0, echo=True, stream=True) if c.choices)
    assert streamed == whole.choices[0].text


def _post(service, path: str, body: dict) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{service['http']}{path}", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_tokenize_gives_the_ids_a_request_gets_and_detokenize_the_text_back(service, model):
    prompt = "The year 2026 has 365 days."
    status, tokenized = _post(service, "/tokenize", {"model": model, "prompt": prompt})
    assert status == 200 and tokenized["count"] == len(tokenized["tokens"]) > 0
    assert tokenized["count"] == _grpc(service, prompt, max_tokens=1).usage.prompt_tokens
    assert _post(service, "/detokenize", {"tokens": tokenized["tokens"]}) == (200, {"prompt": prompt})
    status, chat = _post(service, "/tokenize", {"messages": [{"role": "user", "content": prompt}]})
    assert status == 200 and chat["count"] > tokenized["count"]  # the chat template around it
    assert chat["max_model_len"] == tokenized["max_model_len"] > 0


def test_tokenize_and_detokenize_refuse_what_they_cannot_serve(service):
    assert _post(service, "/tokenize", {"prompt": 7})[0] == 400
    assert _post(service, "/tokenize", {"model": "other", "prompt": "hi"})[0] == 404
    assert _post(service, "/detokenize", {"tokens": [1, "two"]})[0] == 400
    assert _post(service, "/detokenize", {"tokens": [10**9]})[0] == 400


def test_version_names_the_package_version(service):
    import urllib.request

    with urllib.request.urlopen(f"{service['http']}/version", timeout=10) as answer:
        assert json.loads(answer.read())["version"]


def test_metrics_on_the_http_port_carry_the_served_model_name(service, client, model):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    client.completions.create(model=model, prompt="Metrics, please:", max_tokens=2, temperature=0)
    with urllib.request.urlopen(f"{service['http']}/metrics", timeout=10) as answer:
        assert answer.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        families = {f.name: f for f in text_string_to_metric_families(answer.read().decode())}
    for name in ("pdserve_time_to_first_token_seconds", "pdserve_e2e_request_latency_seconds",
                 "pdserve_request_queue_time_seconds", "pdserve_requests", "pdserve_prompt_tokens",
                 "pdserve_generation_tokens"):
        assert {s.labels.get("model_name") for s in families[name].samples} == {model}, name
    finished = [s.value for s in families["pdserve_requests"].samples if s.name == "pdserve_requests_total"]
    assert sum(finished) >= 1
    assert not families["pdserve_requests_waiting"].samples  # a worker's gauge: not the router's


def test_a_list_of_prompts_gives_a_choice_per_prompt_and_sample_whole_and_streamed(client, model):
    prompts = ["The capital of Italy is", "Two plus two is"]
    alone = [client.completions.create(model=model, prompt=p, max_tokens=6, temperature=0) for p in prompts]
    both = client.completions.create(model=model, prompt=prompts, max_tokens=6, temperature=0)
    assert [c.index for c in both.choices] == [0, 1]
    assert [c.text for c in both.choices] == [a.choices[0].text for a in alone]
    assert both.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert both.usage.completion_tokens == 12
    texts: dict[int, str] = {}
    for chunk in client.completions.create(model=model, prompt=prompts, max_tokens=6, temperature=0, n=2,
                                           stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert sorted(texts) == [0, 1, 2, 3]  # prompt * n + sample
    assert [texts[0], texts[2]] == [a.choices[0].text for a in alone]  # greedy: every sample alike
