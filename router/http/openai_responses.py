"""Gateway outputs to OpenAI response bodies: streamed chunks or one whole response, for chat
completions and completions alike.

Log-probabilities come as the model's raw distribution (before temperature and filters, see
pdserve/sampling/logprobs.py); tokens are shown as their decoded text.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pdserve.requests import FinishReason
from router.asks import Output, Usage
from router.http.tool_calls import Call, Parsed, StreamedCalls, parse

TokenText = Callable[[int], str]
FLOOR = -9999.0  # OpenAI's stand-in for a log-probability of -inf (JSON has no infinities)
FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.ABORT: "abort"}


def usage_json(usage: Usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


@dataclass
class Reply:
    """One request's answer in OpenAI's shape; feed it the gateway's outputs in order."""

    request_id: str
    model: str
    chat: bool
    token_text: TokenText
    logprobs: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    text: list[str] = field(default_factory=list)
    entries: list = field(default_factory=list)  # TokenLogprobs of every token so far
    offset: int = 0  # characters of text so far (completions' text_offset)
    finish: str | None = None
    usage: Usage | None = None
    tools: frozenset[str] | None = None  # the functions the model may call: its calls are read off its text
    _calls: StreamedCalls | None = None

    def __post_init__(self) -> None:
        if self.tools:
            self._calls = StreamedCalls(self.tools)

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.request_id}"

    def chunk(self, output: Output, first: bool) -> dict:
        """The streamed chunk for `output` (the first one also says the role, for chat)."""
        self._take(output)
        choice: dict = {"index": 0, "finish_reason": self.finish, "logprobs": self._logprobs(output.logprobs)}
        if self.chat:
            text, calls = self._streamed(output)
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            if calls:
                delta["tool_calls"] = [c.json(i) for i, c in enumerate(calls)]
                choice["finish_reason"] = self._finish_with(calls)
            choice["delta"] = delta if text or calls or first else {}
        else:
            choice["text"] = output.text
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice])

    def usage_chunk(self) -> dict:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = usage_json(self.usage) if self.usage else None
        return body

    def whole(self, outputs: list[Output]) -> dict:
        """The non-streamed response, from every output."""
        for output in outputs:
            self._take(output)
        text = "".join(self.text)
        logprobs = self._logprobs(tuple(self.entries), offset=0)
        choice: dict = {"index": 0, "finish_reason": self.finish, "logprobs": logprobs}
        if self.chat:
            parsed = parse(text, self.tools) if self.tools else Parsed(text, ())
            choice["message"] = {"role": "assistant", "content": parsed.content}
            if parsed.calls:
                choice["message"]["tool_calls"] = [c.json() for c in parsed.calls]
                choice["finish_reason"] = self._finish_with(parsed.calls)
        else:
            choice["text"] = text
        body = self._envelope("chat.completion" if self.chat else "text_completion", [choice])
        body["usage"] = usage_json(self.usage) if self.usage else None
        return body

    def _streamed(self, output: Output) -> tuple[str, tuple[Call, ...]]:
        """The text to send now and, at the end, the calls (text that may begin a call held)."""
        if self._calls is None:
            return output.text, ()
        text = self._calls.feed(output.text)
        if output.finish is None:
            return text, ()
        parsed = self._calls.finish()
        return text + (parsed.content or ""), parsed.calls

    def _finish_with(self, calls: tuple[Call, ...]) -> str | None:
        """OpenAI's reason for an answer that made calls: tool_calls, unless it was cut short."""
        return "tool_calls" if calls and self.finish == "stop" else self.finish

    def _take(self, output: Output) -> None:
        self.text.append(output.text)
        self.entries.extend(output.logprobs)
        if output.finish is not None:
            self.finish = FINISH[output.finish.reason]
            self.usage = output.finish.usage

    def _envelope(self, kind: str, choices: list) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def _logprobs(self, entries, offset: int | None = None) -> dict | None:
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": [self._chat_entry(e) for e in entries]}
        return self._completion_logprobs(entries, self.offset if offset is None else offset)

    def _chat_entry(self, entry) -> dict:
        token = self.token_text(entry.token_id)
        return {"token": token, "logprob": _finite(entry.logprob), "bytes": list(token.encode()),
                "top_logprobs": [{"token": (t := self.token_text(i)), "logprob": _finite(lp), "bytes": list(t.encode())}
                                 for i, lp in entry.top]}

    def _completion_logprobs(self, entries, offset: int) -> dict:
        tokens = [self.token_text(e.token_id) for e in entries]
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        if offset > self.offset:
            self.offset = offset
        return {"tokens": tokens, "token_logprobs": [_finite(e.logprob) for e in entries],
                "top_logprobs": [{self.token_text(i): _finite(lp) for i, lp in e.top} for e in entries],
                "text_offset": offsets}


def _finite(logprob: float) -> float:
    return max(logprob, FLOOR)
