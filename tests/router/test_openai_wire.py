"""OpenAI bodies to asks and outputs to OpenAI bodies, without a server."""

from __future__ import annotations

import pytest

from pdserve.errors import InvalidRequestError
from pdserve.requests import FinishReason, Priority, TokenLogprobs
from router.doors.asks import ChatPrompt, Finish, Output, TextPrompt, TokenPrompt, Usage
from router.doors.http.openai_requests import chat_request, completion_request
from router.doors.http.openai_responses import Reply

def _chat(body, headers=None):
    return chat_request({"messages": [{"role": "user", "content": "hi"}], **body}, headers or {}, "m")


def test_a_chat_body_becomes_an_ask():
    r = chat_request({"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None}],
        "max_completion_tokens": 7, "temperature": 0, "stop": "x", "seed": 3, "top_k": 5, "priority": "batch",
        "stream": True, "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 4,
        "user": "ignored"}, {}, "m")
    assert isinstance(r.ask.prompt, ChatPrompt)
    assert [(m.role, m.content) for m in r.ask.prompt.messages] == [("system", "be brief"), ("user", "ab"),
                                                                    ("assistant", "")]
    s = r.ask.sampling
    assert (s.max_tokens, s.temperature, s.stop, s.seed, s.top_k, s.logprobs) == (7, 0.0, ("x",), 3, 5, 4)
    assert r.ask.priority == Priority.BATCH and r.stream and r.include_usage and r.logprobs and r.chat


def test_biases_and_penalties_reach_the_sampling_settings():
    sampling = _chat({"logit_bias": {"5": 2.5, "3": -1}, "presence_penalty": 0.5, "frequency_penalty": -0.25,
                      "repetition_penalty": 1.2, "min_tokens": 3}).ask.sampling
    assert sampling.logit_bias == ((3, -1.0), (5, 2.5))
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -0.25)
    assert (sampling.repetition_penalty, sampling.min_tokens) == (1.2, 3)


def test_defaults_are_the_grpc_defaults():
    s = _chat({}).ask.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.logprobs) == (256, 1.0, 1.0, None)


def test_the_priority_header_wins_and_the_request_id_header_names_it():
    r = _chat({"priority": "batch", "request_id": "body"}, {"x-pdserve-priority": "vip", "x-request-id": "hdr"})
    assert r.ask.priority == Priority.VIP and r.ask.request_id == "hdr"


@pytest.mark.parametrize("prompt,kind", [("text", TextPrompt), (["text"], TextPrompt), ([1, 2, 3], TokenPrompt),
                                         ([[1, 2]], TokenPrompt)])
def test_a_completion_prompt_is_text_or_token_ids(prompt, kind):
    r = completion_request({"prompt": prompt, "logprobs": 2}, {}, "m")
    assert isinstance(r.ask.prompt, kind) and r.ask.sampling.logprobs == 2 and not r.chat


@pytest.mark.parametrize("body,needle", [
    ({"temperature": "hot"}, "temperature must be a number"),
    ({"max_tokens": 1.5}, "max_tokens must be an integer"),
    ({"stream": "yes"}, "stream must be true or false"),
    ({"n": 0}, r"n must be in \[1, 16\]"),
    ({"n": 2, "best_of": 1}, "best_of must be in"),
    ({"n": 1, "best_of": 3, "stream": True}, "cannot be streamed"),
    ({"stop": [1]}, "stop must be a string"),
    ({"top_logprobs": 2}, "needs logprobs"),
    ({"tools": [{"type": "function"}]}, r"tools\[0\] must be"),
    ({"priority": "gold"}, "priority"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text parts"),
    ({"messages": "hi"}, "messages must be a non-empty list"),
    ({"messages": [3]}, "must be an object"),
    ({"logit_bias": [1, 2]}, "logit_bias must be an object"),
    ({"logit_bias": {"x1": 1}}, "logit_bias keys must be token ids"),
    ({"logit_bias": {"1": "high"}}, r"logit_bias\[1\] must be a number"),
    ({"presence_penalty": "some"}, "presence_penalty"),
])
def test_malformed_chat_bodies_are_refused_naming_the_field(body, needle):
    with pytest.raises(InvalidRequestError, match=needle):
        _chat(body)


@pytest.mark.parametrize("prompt", [None, [], [["a"], ["b"]], ["a", 3], [True], 3, ["a"] * 65])
def test_malformed_completion_prompts_are_refused(prompt):  # (an empty text: the gateway refuses it)
    with pytest.raises(InvalidRequestError):
        completion_request({"prompt": prompt}, {}, "m")


def test_a_list_of_prompts_is_one_request_each_with_ids_of_its_own():
    r = completion_request({"prompt": ["one", [5, 6]], "n": 2, "request_id": "batch"}, {}, "m")
    each = r.each()
    assert [type(e.ask.prompt) for e in each] == [TextPrompt, TokenPrompt]
    assert [e.ask.request_id for e in each] == ["batch-0", "batch-1"]
    assert all(e.ask.count.n == 2 and not e.more for e in each)
    with pytest.raises(InvalidRequestError, match="one prompt per request"):
        completion_request({"prompt": ["a", "b"], "echo": True}, {}, "m")


def _outputs():
    usage = Usage(prompt_tokens=5, completion_tokens=2, cached_tokens=1)
    return [Output((1,), "He", (TokenLogprobs(1, -0.1, ((1, -0.1), (2, -2.5))),)),
            Output((2,), "llo", (TokenLogprobs(2, -0.7, ((2, -0.7), (1, -0.9))),), Finish(FinishReason.LENGTH, usage))]


def _text(token: int) -> str:
    return {1: "He", 2: "llo"}[token]


def test_a_whole_chat_reply_has_openai_shape_and_logprobs():
    body = Reply("r1", "m", chat=True, token_text=_text, logprobs=True).whole(_outputs())
    choice = body["choices"][0]
    assert body["id"] == "chatcmpl-r1" and body["object"] == "chat.completion" and body["model"] == "m"
    assert choice["message"] == {"role": "assistant", "content": "Hello"} and choice["finish_reason"] == "length"
    assert [e["token"] for e in choice["logprobs"]["content"]] == ["He", "llo"]
    assert choice["logprobs"]["content"][1]["top_logprobs"][1] == {"token": "He", "logprob": -0.9,
                                                                   "bytes": list(b"He")}
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                             "prompt_tokens_details": {"cached_tokens": 1}}


def test_streamed_completion_chunks_carry_offsets_and_a_usage_chunk():
    reply = Reply("r2", "m", chat=False, token_text=_text, logprobs=True)
    chunks = [reply.chunk(o) for o in _outputs()]
    assert [c["choices"][0]["text"] for c in chunks] == ["He", "llo"]
    assert [c["choices"][0]["logprobs"]["text_offset"] for c in chunks] == [[0], [2]]
    assert chunks[1]["choices"][0]["logprobs"]["top_logprobs"] == [{"llo": -0.7, "He": -0.9}]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, "length"]
    assert reply.usage_chunk()["choices"] == [] and reply.usage_chunk()["usage"]["total_tokens"] == 7


def test_a_chat_stream_says_the_role_first_and_nothing_without_logprobs():
    reply = Reply("r3", "m", chat=True, token_text=_text)
    first, last = (reply.chunk(o) for o in _outputs())
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "He"}
    assert last["choices"][0]["delta"] == {"content": "llo"} and last["choices"][0]["logprobs"] is None


def test_echo_begins_each_completion_with_its_prompt_whole_and_streamed():
    request = completion_request({"prompt": "Once", "echo": True}, {}, "m")
    assert request.echo
    whole = Reply("r4", "m", chat=False, token_text=_text, echo="Once").whole(_outputs())
    assert whole["choices"][0]["text"] == "OnceHello"
    reply = Reply("r5", "m", chat=False, token_text=_text, echo="Once")
    assert [reply.chunk(o)["choices"][0]["text"] for o in _outputs()] == ["OnceHe", "llo"]


def test_echo_with_logprobs_asks_for_the_prompts_and_gives_them_first():
    request = completion_request({"prompt": "Once", "echo": True, "logprobs": 1}, {}, "m")
    assert request.ask.sampling.prompt_logprobs == 1 and request.ask.sampling.logprobs == 1
    outputs = _outputs()
    outputs[0] = Output(outputs[0].token_ids, outputs[0].text, outputs[0].logprobs,
                        prompt_logprobs=(TokenLogprobs(2, -1.5, ((1, -0.5),)),))
    body = Reply("r6", "m", chat=False, token_text=_text, logprobs=True, echo="HeHe", echo_first=1).whole(outputs)
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["He", "llo", "He", "llo"]
    assert logprobs["token_logprobs"] == [None, -1.5, -0.1, -0.7]
    assert logprobs["top_logprobs"][0] is None and logprobs["top_logprobs"][1] == {"He": -0.5}
    assert logprobs["text_offset"] == [0, 2, 5, 7]


def test_echo_is_refused_where_it_cannot_be_served():
    with pytest.raises(InvalidRequestError, match="echo must be true or false"):
        completion_request({"prompt": "a", "echo": "yes"}, {}, "m")
    with pytest.raises(InvalidRequestError, match="echo is not supported"):
        _chat({"echo": True})


def test_a_last_event_id_continues_the_stream_it_names_after_its_tokens():
    r = _chat({"stream": True}, {"last-event-id": "story/1/17"})  # (the request id may hold a slash)
    assert r.ask.request_id == "story/1" and r.ask.resume.from_token == 17 and r.ask.resume.prior is None
    same = _chat({"stream": True}, {"last-event-id": "story/17", "x-request-id": "story"})
    assert same.ask.request_id == "story" and same.ask.resume.from_token == 17
    assert _chat({"stream": True}).ask.resume is None


@pytest.mark.parametrize("body,headers,needle", [
    ({"stream": True}, {"last-event-id": "story"}, "<request id>/<tokens>"),
    ({"stream": True}, {"last-event-id": "story/x"}, "<request id>/<tokens>"),
    ({"stream": True}, {"last-event-id": "story/3", "x-request-id": "other"}, "X-Request-Id"),
    ({}, {"last-event-id": "story/3"}, "stream true"),
    ({"stream": True, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     {"last-event-id": "story/3"}, "tools"),
])
def test_a_last_event_id_that_cannot_be_served_is_refused(body, headers, needle):
    with pytest.raises(InvalidRequestError) as refused:
        _chat(body, headers)
    assert needle in str(refused.value)
