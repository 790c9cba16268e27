"""A model's function calls read off its output, whole or as it streams: every
<tool_call>{"name", "arguments"}</tool_call> (the format pdserve/tokenizer/tool_prompt.py asks
for, and Hermes- and Qwen-style templates use), or an output that is one JSON object with a
`name` and `arguments` (or `parameters`, Llama-3 style) and nothing else. A call must name one of
the request's functions with an object of arguments; an output with none is text.

Streaming: text goes out as it comes, except a tail that may begin a call (a prefix of
<tool_call>, or an output that begins with `{`), held until it is known; once a call begins, the
rest is held to the end and then given as calls (text before the first call stays text)."""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from pdserve.tokenizer.tool_prompt import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: str  # a JSON object's text

    def json(self, index: int | None = None) -> dict:
        body = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return body if index is None else {"index": index, **body}


@dataclass(frozen=True)
class Parsed:
    content: str | None  # text besides the calls (None: nothing but calls)
    calls: tuple[Call, ...]


def parse(text: str, names: frozenset[str]) -> Parsed:
    """The calls in a whole output; no call: the text as it is."""
    blocks = [_call(m.group(1), names) for m in _BLOCK.finditer(text)]
    if blocks and all(blocks):
        rest = _BLOCK.sub("", text).strip()
        return Parsed(rest or None, tuple(blocks))
    whole = _call(text, names) if text.lstrip().startswith("{") else None
    return Parsed(None, (whole,)) if whole else Parsed(text, ())


def _call(text: str, names: frozenset[str]) -> Call | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return Call(f"call_{secrets.token_hex(12)}", value["name"], json.dumps(arguments, ensure_ascii=False))


class StreamedCalls:
    """An output's text as it streams, with calls held back: `feed` gives the text to send now,
    `finish` the rest of the text and the calls."""

    def __init__(self, names: frozenset[str]):
        self.names = names
        self._held = ""
        self._spoke = False  # text other than whitespace was sent
        self._holding = False  # a call began: everything from here is held (it only grows)

    def feed(self, text: str) -> str:
        """Work on `text` and the held tail only, never on what was sent before."""
        self._held += text
        self._holding = self._holding or self._holding_all()
        if self._holding:
            return ""
        cut = _safe_prefix(self._held)
        out, self._held = self._held[:cut], self._held[cut:]
        self._spoke = self._spoke or bool(out.strip())
        return out

    def finish(self) -> Parsed:
        """The held text parsed: its calls, and its text not sent yet (None when only calls)."""
        if not self._held:
            return Parsed(None, ())
        parsed = parse(self._held, self.names)
        return parsed if parsed.calls else Parsed(self._held, ())

    def _holding_all(self) -> bool:
        """A call's marker held, or a bare JSON object (what was sent before it only whitespace)."""
        return TOOL_CALL_OPEN in self._held or (not self._spoke and self._held.lstrip().startswith("{"))


def _safe_prefix(text: str) -> int:
    """How much of `text` cannot begin a call marker (the rest may be a prefix of <tool_call>)."""
    for keep in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
        if TOOL_CALL_OPEN.startswith(text[-keep:]):
            return len(text) - keep
    return len(text)
