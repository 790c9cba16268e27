"""OpenAI request bodies (`/v1/chat/completions`, `/v1/completions`) to an Ask.

Sampling defaults are the gRPC API's (max_tokens 256, temperature 1.0, ...), so both doors
answer a request alike. pdserve's own settings are extra body fields, as vLLM takes them:
`top_k`, `min_p`, `ignore_eos`, `priority` ("vip", "normal", "batch"), `request_id`,
`stop_token_ids`, `repetition_penalty`, `min_tokens`; structured output as OpenAI's `response_format`
or vLLM's `structured_outputs` and `guided_*` (router/doors/http/structured.py); a chat's `tools`,
`tool_choice` and `parallel_tool_calls`, and its messages' tool calls and results
(router/doors/http/tools.py). The `x-pdserve-priority`
header, set by a gateway, wins over the body's. The request id is the `X-Request-Id` header's (else
the body's `request_id`, else the router's own). A streamed request whose stream broke continues,
at any router of a tier, when POSTed again with the same body and the standard `Last-Event-ID`
header: the id of the last event the client got, `<request id>/<tokens it has>` (every event of a
stream carries one), by the decode worker that still holds the request (pdserve/reattach.py);
none holds it: 404 (the client's text is not its tokens, so nothing else can go on from it).
Sizes (messages, token ids, stop strings) are the gateway's to check, as for the gRPC door.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.errors import InvalidRequestError
from pdserve.requests import Constraint, Priority, SamplingParams
from pdserve.tokenizer import ChatMessage
from router.doors.asks import (Ask, AskSizes, ChatPrompt, Prompt, Resume, SampleCount, TextPrompt, TokenPrompt,
                         check_count, sizes_of)
from router.doors.http.fields import Body, boolean, integer, integers, number, string, strings, unsupported
from router.doors.http.structured import constraint_of
from router.doors.http.tools import ToolUse, tool_message, tool_use

PRIORITY_HEADER = "x-pdserve-priority"
REQUEST_ID_HEADER = "x-request-id"
LAST_EVENT_HEADER = "last-event-id"
ROLE_ALIASES = {"developer": "system"}  # OpenAI's newer name for the system role
_NOT_IMPLEMENTED = {"functions": [], "suffix": ""}
_NOT_FOR_COMPLETIONS = {"tools": [], "tool_choice": "none"}  # tools are a chat's
_NOT_FOR_CHATS = {"echo": False}  # echo is a completion's


@dataclass(frozen=True)
class OpenAIRequest:
    ask: Ask
    chat: bool
    model: str
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    logprobs: bool = False
    tools: ToolUse | None = None  # the functions the model may call (chat), router/doors/http/tools.py
    echo: bool = False  # a completion's text begins with its prompt's
    more: tuple[Prompt, ...] = ()  # a completion's further prompts (a list of prompts): one request each

    def each(self) -> list["OpenAIRequest"]:
        """One request per prompt, the first this one; the others' ids are this one's with
        "-1", "-2", ... (this one's gets "-0" when there are several)."""
        if not self.more:
            return [self]
        base = self.ask.request_id
        return [dataclasses.replace(self, more=(), ask=dataclasses.replace(
                    self.ask, prompt=prompt, request_id=f"{base}-{i}" if base else ""))
                for i, prompt in enumerate((self.ask.prompt, *self.more))]


class ParsedAsk:
    """An OpenAI body as the gateway's AskSource: parsed when the gateway first reads it (the body's
    size was bounded before, router/doors/http/app.py), its sizes then read off the Ask."""

    def __init__(self, parse: Callable[[], OpenAIRequest]):
        self._parse = parse
        self._parsed: OpenAIRequest | None = None

    def parsed(self) -> OpenAIRequest:
        if self._parsed is None:
            self._parsed = self._parse()
        return self._parsed

    def sizes(self) -> AskSizes:
        return sizes_of(self.parsed().ask)

    def ask(self) -> Ask:
        return self.parsed().ask


def chat_request(body: Body, headers, model: str) -> OpenAIRequest:
    messages = chat_messages(body.get("messages"))
    top = integer(body, "top_logprobs", None)
    logprobs = boolean(body, "logprobs", False)
    if top is not None and not logprobs:
        raise InvalidRequestError("top_logprobs needs logprobs: true")
    max_tokens = integer(body, "max_completion_tokens", integer(body, "max_tokens", None))
    unsupported(body, _NOT_FOR_CHATS)
    tools = tool_use(body)
    prompt = ChatPrompt(messages, tools.tools if tools else ())
    return _request(body, headers, model, prompt, max_tokens, (top or 0) if logprobs else None, chat=True,
                    tools=tools)


def completion_request(body: Body, headers, model: str) -> OpenAIRequest:
    if isinstance(body, dict):
        unsupported(body, _NOT_FOR_COMPLETIONS)
    logprobs = integer(body, "logprobs", None)
    echo = boolean(body, "echo", False) if isinstance(body, dict) else False
    first, *more = _completion_prompts(body.get("prompt"))
    if more and echo:
        raise InvalidRequestError("echo is served for one prompt per request")
    request = _request(body, headers, model, first, integer(body, "max_tokens", None), logprobs, chat=False)
    request = dataclasses.replace(request, more=tuple(more))
    if more and request.ask.resume is not None:
        raise InvalidRequestError("a completion of several prompts cannot be continued (Last-Event-ID)")
    if echo and logprobs is not None:  # the prompt's tokens' log-probabilities come first
        sampling = dataclasses.replace(request.ask.sampling, prompt_logprobs=logprobs)
        request = dataclasses.replace(request, ask=dataclasses.replace(request.ask, sampling=sampling))
    return dataclasses.replace(request, echo=echo)


def _request(body: Body, headers, model: str, prompt: Prompt, max_tokens: int | None,
             logprobs: int | None, chat: bool, tools: ToolUse | None = None) -> OpenAIRequest:
    if not isinstance(body, dict):
        raise InvalidRequestError("the body must be a JSON object")
    unsupported(body, _NOT_IMPLEMENTED)
    constraint = _one_constraint(constraint_of(body), tools.constraint if tools else None)
    count = SampleCount(integer(body, "n", 1), integer(body, "best_of", None))
    if (message := check_count(count, boolean(body, "stream", False))) is not None:
        raise InvalidRequestError(message)
    stop = strings(body, "stop")
    stop_ids = integers(body, "stop_token_ids")
    d = SamplingParams()
    sampling = SamplingParams(
        max_tokens=d.max_tokens if max_tokens is None else max_tokens,
        temperature=number(body, "temperature", d.temperature), top_p=number(body, "top_p", d.top_p),
        top_k=integer(body, "top_k", d.top_k), min_p=number(body, "min_p", d.min_p),
        seed=integer(body, "seed", None), stop=stop, stop_token_ids=stop_ids,
        ignore_eos=boolean(body, "ignore_eos", False), logprobs=logprobs,
        presence_penalty=number(body, "presence_penalty", d.presence_penalty),
        frequency_penalty=number(body, "frequency_penalty", d.frequency_penalty),
        repetition_penalty=number(body, "repetition_penalty", d.repetition_penalty),
        logit_bias=_logit_bias(body.get("logit_bias")), min_tokens=integer(body, "min_tokens", d.min_tokens),
        constraint=constraint)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidRequestError("stream_options must be an object")
    request_id, resume = _continued(headers, _request_id(body, headers), boolean(body, "stream", False), tools)
    return OpenAIRequest(
        Ask(prompt, sampling, _priority(body, headers), request_id, count, resume), chat,
        string(body, "model", model) or model, boolean(body, "stream", False),
        boolean(options, "include_usage", False), logprobs is not None, tools)


def _one_constraint(asked: Constraint | None, calls: Constraint | None) -> Constraint | None:
    if asked is not None and calls is not None:
        raise InvalidRequestError("tool_choice required or named constrains the output to calls: "
                                  "it cannot go with response_format or structured_outputs")
    return asked or calls


def _logit_bias(value) -> tuple[tuple[int, float], ...]:
    """OpenAI's map of token ids (as strings) to biases; its values are checked with the rest."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidRequestError("logit_bias must be an object of token ids to numbers")
    bias = []
    for key, number_ in value.items():
        if not (isinstance(key, str) and key.strip().isdigit()):
            raise InvalidRequestError(f"logit_bias keys must be token ids, got {key[:32]!r}")
        if isinstance(number_, bool) or not isinstance(number_, int | float):
            raise InvalidRequestError(f"logit_bias[{key}] must be a number")
        bias.append((int(key), float(number_)))
    return tuple(sorted(bias))


def chat_messages(messages) -> list[ChatMessage]:
    """A request's `messages` as the chat template takes them; InvalidRequestError when malformed."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list")
    return [_message(i, m) for i, m in enumerate(messages)]


def _message(index: int, message) -> ChatMessage:
    if not isinstance(message, dict):
        raise InvalidRequestError(f"messages[{index}] must be an object with role and content")
    role = message.get("role")
    if not isinstance(role, str):
        raise InvalidRequestError(f"messages[{index}].role must be a string")
    return tool_message(index, ROLE_ALIASES.get(role, role), _content(index, message.get("content")), message)


def _content(index: int, content) -> str:
    """A string, or a list of text parts (joined); null is empty (an assistant turn)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise InvalidRequestError(f"messages[{index}].content: only text parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidRequestError(f"messages[{index}].content must be a string or a list of text parts")


MAX_PROMPTS = 64  # prompts in one completion request


def _completion_prompts(prompt) -> list[Prompt]:
    """A string, a list of token ids, or a list of either (several prompts: a choice each)."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise InvalidRequestError(f"prompt: at most {MAX_PROMPTS} prompts per request, got {len(prompt)}")
        return [_completion_prompt(p) for p in prompt]
    return [_completion_prompt(prompt)]


def _completion_prompt(prompt) -> Prompt:
    """A string or a list of token ids."""
    if isinstance(prompt, str):
        return TextPrompt(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return TokenPrompt(prompt)
    raise InvalidRequestError("prompt must be a non-empty string or a list of token ids, or a list of those")


def _priority(body: Body, headers) -> Priority:
    asked = headers.get(PRIORITY_HEADER) or string(body, "priority", None) or "normal"
    try:
        return Priority[asked.upper()]
    except KeyError:
        raise InvalidRequestError(f"priority {asked[:32]!r} is not one of vip, normal, batch") from None


def _request_id(body: Body, headers) -> str:
    return headers.get(REQUEST_ID_HEADER) or string(body, "request_id", "") or ""


def _continued(headers, request_id: str, stream: bool, tools: ToolUse | None) -> tuple[str, Resume | None]:
    """The request's id and, with a Last-Event-ID (`<request id>/<tokens>`), where it goes on."""
    last = headers.get(LAST_EVENT_HEADER)
    if last is None:
        return request_id, None
    named, _, count = last.rpartition("/")
    if not named or not count.isdigit():
        raise InvalidRequestError(f"Last-Event-ID must be <request id>/<tokens> as this server's events name "
                                  f"them, got {last[:64]!r}")
    if request_id and request_id != named:
        raise InvalidRequestError(f"Last-Event-ID names request {named[:64]!r}, X-Request-Id {request_id[:64]!r}")
    if not stream:
        raise InvalidRequestError("Last-Event-ID continues a stream: set stream true")
    if tools is not None:
        raise InvalidRequestError("a chat with tools cannot be continued (Last-Event-ID)")
    return named, Resume(int(count))
