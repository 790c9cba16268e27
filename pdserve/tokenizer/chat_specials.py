"""Special-token strings typed into a chat stay text; the template's own become control tokens.

Before rendering, every special-token string in a message (role or content) is replaced by an
escape the template passes through untouched: the string's index between two marker characters,
a character found in no message, no special string and not in the template. After rendering,
every special-token string left in the text is one the template wrote; the escapes turn back
into their strings, as plain text:

    content   "hi <|im_start|>"   ->  "hi ⟨3⟩"          (⟨ ⟩: the marker; 3: the string's index)
    rendered  "<|im_start|>user\\nhi ⟨3⟩<|im_end|>\\n"
    parts     <|im_start|> | "user\\nhi <|im_start|>" | <|im_end|> | "\\n"
              special        text                      special      text

NOTE: a special-token string the template forms by joining a message to its own text (a template
writing "|>" right after the content) counts as the template's. A special string in a message
comes back as typed, even where the template changes the text around it (`| upper`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

from pdserve.tokenizer.base import ChatTemplateError, MessageLike
from pdserve.tokenizer.chat_template import message_dict

_MARKER_CANDIDATES = (range(0xE000, 0xF900), range(0xF0000, 0xFFFFE))


@dataclass(frozen=True)
class PromptPart:
    """A run of prompt text: `special` parts are one special-token string the template wrote;
    the others are text whose special-token strings are ordinary characters."""

    text: str
    special: bool


@dataclass(frozen=True)
class EscapedChat:
    """Messages ready for the template. `marker` is None when no message held a special string."""

    messages: tuple[dict[str, object], ...]
    marker: str | None
    tools: tuple[dict[str, object], ...] = ()  # the functions named, escaped alike


def _strings(value) -> Iterable[str]:
    """Every string inside `value` (nested dicts and lists)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _free_marker(texts: Iterable[str]) -> str:
    used = set(chain.from_iterable(texts))
    for code in chain.from_iterable(_MARKER_CANDIDATES):
        if chr(code) not in used:
            return chr(code)
    raise ChatTemplateError("the conversation uses every private-use character; none is left to escape with")


class SpecialStrings:
    """The special-token strings of one tokenizer, matched leftmost-longest as the tokenizer does."""

    def __init__(self, strings: Iterable[str]) -> None:
        self.strings = tuple(sorted(set(strings), key=lambda s: (-len(s), s)))
        self._index = {s: i for i, s in enumerate(self.strings)}
        alternatives = "|".join(re.escape(s) for s in self.strings)
        self._pattern = re.compile(alternatives or "(?!)")

    def escape(self, messages: Sequence[MessageLike], template_source: str,
               tools: Sequence[Mapping[str, object]] = ()) -> EscapedChat:
        """The messages (validated) and the tools, with their special-token strings escaped."""
        dicts = [message_dict(m, i) for i, m in enumerate(messages)]
        tool_dicts = [dict(t) for t in tools]
        fields = list(_strings([dicts, tool_dicts]))
        if not any(self._pattern.search(value) for value in fields):
            return EscapedChat(tuple(dicts), None, tuple(tool_dicts))
        marker = _free_marker([template_source, *self.strings, *fields])
        return EscapedChat(tuple(self._escape(d, marker) for d in dicts), marker,
                           tuple(self._escape(t, marker) for t in tool_dicts))

    def _escape(self, value, marker: str):
        """Every string in `value` (a message's fields, its tool calls' names and arguments) escaped."""
        if isinstance(value, str):
            return self._pattern.sub(lambda m: f"{marker}{self._index[m.group()]}{marker}", value)
        if isinstance(value, dict):
            return {key: self._escape(item, marker) for key, item in value.items()}
        if isinstance(value, list):
            return [self._escape(item, marker) for item in value]
        return value

    def split(self, rendered: str, chat: EscapedChat) -> tuple[PromptPart, ...]:
        """`rendered` (the template's output for `chat.messages`) as parts, escapes restored."""
        parts: list[PromptPart] = []
        start = 0
        for match in self._pattern.finditer(rendered):
            parts.append(PromptPart(self._restore(rendered[start : match.start()], chat.marker), False))
            parts.append(PromptPart(match.group(), True))
            start = match.end()
        parts.append(PromptPart(self._restore(rendered[start:], chat.marker), False))
        return tuple(part for part in parts if part.text)

    def _restore(self, text: str, marker: str | None) -> str:
        if marker is None:
            return text
        escape = re.compile(f"{re.escape(marker)}([0-9]+){re.escape(marker)}")
        restored = escape.sub(lambda m: self._string_at(m.group(1)), text)
        return restored.replace(marker, "")

    def _string_at(self, index: str) -> str:
        position = int(index)
        return self.strings[position] if position < len(self.strings) else ""
