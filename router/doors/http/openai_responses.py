"""Gateway outputs to OpenAI response bodies: streamed chunks or one whole response, for chat
completions and completions alike.

Log-probabilities come as the model's raw distribution (before temperature and filters, see
pdserve/sampling/logprobs.py); tokens are shown as their decoded text.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pdserve.requests import FinishReason
from router.doors.asks import Output, Usage
from router.doors.http.tool_calls import Call, Parsed, StreamedCalls, parse

TokenText = Callable[[int], str]
FLOOR = -9999.0  # OpenAI's stand-in for a log-probability of -inf (JSON has no infinities)
FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.ABORT: "abort"}


def usage_json(usage: Usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


@dataclass
class _Choice:
    """One sample's answer so far."""

    index: int
    text: list[str] = field(default_factory=list)
    entries: list = field(default_factory=list)  # TokenLogprobs of every token so far
    offset: int = 0  # characters of text so far (completions' text_offset)
    finish: str | None = None
    usage: Usage | None = None
    calls: StreamedCalls | None = None  # its calls, read off its text (tools)
    started: bool = False  # its first chunk was sent (a chat's says the role, an echo's has the prompt)


@dataclass
class Reply:
    """One request's answer in OpenAI's shape, one choice per sample (`Output.index`); feed it
    the gateway's outputs in order."""

    request_id: str
    model: str
    chat: bool
    token_text: TokenText
    logprobs: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    tools: frozenset[str] | None = None  # the functions the model may call: its calls are read off its text
    echo: str = ""  # a completion's prompt, which each choice's text begins with (echo)
    echo_first: int | None = None  # the prompt's first token (echo with logprobs: it has none)
    prompt_entries: tuple = ()  # the prompt's TokenLogprobs (echo with logprobs), from the first output
    samples_per_prompt: int = 1  # n: choices prompt * n .. prompt * n + n - 1 share a prompt (a list of prompts)
    choices: dict[int, _Choice] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.request_id}"

    def chunk(self, output: Output) -> dict:
        """The streamed chunk for `output` (a chat choice's first one also says the role)."""
        c = self._take(output)
        first = not c.started
        choice: dict = {"index": c.index, "finish_reason": c.finish,
                        "logprobs": self._logprobs(c, output.logprobs, echoed=first and bool(self.echo))}
        if self.chat:
            text, calls = self._streamed(c, output)
            delta = {"content": text} if c.started else {"role": "assistant", "content": text}
            if calls:
                delta["tool_calls"] = [call.json(i) for i, call in enumerate(calls)]
                choice["finish_reason"] = _finish_with(c, calls)
            choice["delta"] = delta if text or calls or not c.started else {}
            c.started = True
        else:
            choice["text"] = (self.echo if first else "") + output.text
            c.started = True
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice])

    def usage_chunk(self) -> dict:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = self._usage()
        return body

    def whole(self, outputs: list[Output]) -> dict:
        """The non-streamed response, from every output."""
        for output in outputs:
            self._take(output)
        choices = [self._whole_choice(c) for _, c in sorted(self.choices.items())]
        body = self._envelope("chat.completion" if self.chat else "text_completion", choices)
        body["usage"] = self._usage()
        return body

    def _whole_choice(self, c: _Choice) -> dict:
        text = "".join(c.text)
        choice: dict = {"index": c.index, "finish_reason": c.finish,
                        "logprobs": self._logprobs(c, tuple(c.entries), offset=0, echoed=bool(self.echo))}
        if not self.chat:
            choice["text"] = self.echo + text
            return choice
        parsed = parse(text, self.tools) if self.tools else Parsed(text, ())
        choice["message"] = {"role": "assistant", "content": parsed.content}
        if parsed.calls:
            choice["message"]["tool_calls"] = [call.json() for call in parsed.calls]
            choice["finish_reason"] = _finish_with(c, parsed.calls)
        return choice

    def _usage(self) -> dict | None:
        """The request's usage: each prompt once, every sample's completion tokens."""
        ended = [(i, c.usage) for i, c in sorted(self.choices.items()) if c.usage is not None]
        if not ended:
            return None
        per_prompt = {i // self.samples_per_prompt: u for i, u in reversed(ended)}  # each prompt's first
        prompts = list(per_prompt.values())
        return usage_json(dataclasses.replace(
            prompts[0], prompt_tokens=sum(u.prompt_tokens for u in prompts),
            cached_tokens=sum(u.cached_tokens for u in prompts),
            completion_tokens=sum(u.completion_tokens for _, u in ended)))

    def _streamed(self, c: _Choice, output: Output) -> tuple[str, tuple[Call, ...]]:
        """The text to send now and, at the end, the calls (text that may begin a call held)."""
        if c.calls is None:
            return output.text, ()
        text = c.calls.feed(output.text)
        if output.finish is None:
            return text, ()
        parsed = c.calls.finish()
        return text + (parsed.content or ""), parsed.calls

    def _take(self, output: Output) -> _Choice:
        c = self.choices.get(output.index)
        if c is None:
            c = self.choices[output.index] = _Choice(output.index, calls=StreamedCalls(self.tools) if self.tools
                                                     else None)
        c.text.append(output.text)
        c.entries.extend(output.logprobs)
        self.prompt_entries = output.prompt_logprobs or self.prompt_entries
        if output.finish is not None:
            c.finish = FINISH[output.finish.reason]
            c.usage = output.finish.usage
        return c

    def _envelope(self, kind: str, choices: list) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def _logprobs(self, c: _Choice, entries, offset: int | None = None, echoed: bool = False) -> dict | None:
        """`echoed`: the prompt's text goes out with these entries (echo): its tokens come first."""
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": [self._chat_entry(e) for e in entries]}
        rows = [(self._top(e.top), e.token_id, _finite(e.logprob)) for e in entries]
        if echoed and self.echo_first is not None:
            rows = [({}, self.echo_first, None), *((self._top(e.top), e.token_id, _finite(e.logprob))
                                                   for e in self.prompt_entries), *rows]
        return self._completion_logprobs(c, rows, c.offset if offset is None else offset)

    def _top(self, top) -> dict:
        return {self.token_text(i): _finite(lp) for i, lp in top}

    def _chat_entry(self, entry) -> dict:
        token = self.token_text(entry.token_id)
        return {"token": token, "logprob": _finite(entry.logprob), "bytes": list(token.encode()),
                "top_logprobs": [{"token": (t := self.token_text(i)), "logprob": _finite(lp), "bytes": list(t.encode())}
                                 for i, lp in entry.top]}

    def _completion_logprobs(self, c: _Choice, rows, offset: int) -> dict:
        """rows: (top alternatives, token id, log-probability: None for the prompt's first token)."""
        tokens = [self.token_text(token) for _, token, _ in rows]
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        if offset > c.offset:
            c.offset = offset
        return {"tokens": tokens, "token_logprobs": [lp for _, _, lp in rows],
                "top_logprobs": [top if lp is not None else None for top, _, lp in rows], "text_offset": offsets}


def _finish_with(c: _Choice, calls: tuple[Call, ...]) -> str | None:
    """OpenAI's reason for an answer that made calls: tool_calls, unless it was cut short."""
    return "tool_calls" if calls and c.finish == "stop" else c.finish


def _finite(logprob: float) -> float:
    return max(logprob, FLOOR)
