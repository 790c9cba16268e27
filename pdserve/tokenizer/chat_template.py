"""Chat templates: Jinja2 source rendered in a sandbox.

The environment follows the conventions model authors write templates for: blocks trimmed,
`loopcontrols` enabled, `raise_exception(msg)`, `strftime_now(fmt)` and a `tojson` that keeps
non-ASCII characters. Variables: `messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
and `tools` when the request names functions (each message as transformers passes it: `role`,
`content`, an assistant's `tool_calls` as [{"id", "type": "function", "function": {"name",
"arguments": an object}}], a tool turn's `tool_call_id`).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pdserve.tokenizer.base import ChatMessage, ChatTemplateError, MessageLike


class _TemplateRaised(Exception):
    """Raised by the template's own `raise_exception`."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(value: object, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def message_dict(message: MessageLike, index: int) -> dict[str, object]:
    """A message as the template indexes it; ChatTemplateError when role or content is bad."""
    if isinstance(message, ChatMessage):
        role, content = message.role, message.content
        extra = _tool_fields(message)
    elif isinstance(message, Mapping):
        role, content = message.get("role"), message.get("content")
        extra = {k: message[k] for k in ("tool_calls", "tool_call_id") if message.get(k) is not None}
    else:
        kind = type(message).__name__
        raise ChatTemplateError(f"message {index}: expected a ChatMessage or a mapping, got {kind}")
    if not isinstance(role, str) or not role:
        raise ChatTemplateError(f"message {index}: 'role' must be a non-empty string, got {role!r}")
    if not isinstance(content, str):
        raise ChatTemplateError(f"message {index}: 'content' must be a string, got {type(content).__name__}")
    return {"role": role, "content": content, **extra}


def _tool_fields(message: ChatMessage) -> dict[str, object]:
    extra: dict[str, object] = {}
    if message.tool_calls:
        extra["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name,
                                "arguments": _arguments(c.arguments)}} for c in message.tool_calls]
    if message.tool_call_id is not None:
        extra["tool_call_id"] = message.tool_call_id
    return extra


def _arguments(text: str) -> object:
    """A call's arguments as templates index them: the object its JSON text holds, else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class ChatTemplate:
    """One compiled chat template. Rendering is thread-safe."""

    def __init__(self, source: str) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        self.source = source
        # Whether the template has a tool section of its own (reads `tools`); without one, tools are
        # stated in a system message (pdserve/tokenizer/tool_prompt.py).
        self.handles_tools = "tools" in jinja2.meta.find_undeclared_variables(_environment().parse(source))

    def render(
        self,
        messages: Sequence[MessageLike],
        add_generation_prompt: bool,
        bos_token: str,
        eos_token: str,
        tools: Sequence[Mapping[str, object]] = (),
    ) -> str:
        """The conversation as prompt text. Raises ChatTemplateError on any failure."""
        if not messages:
            raise ChatTemplateError("a conversation needs at least one message")
        dicts = [message_dict(m, i) for i, m in enumerate(messages)]
        try:
            return self._template.render(
                messages=dicts,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos_token,
                eos_token=eos_token,
                **({"tools": [dict(t) for t in tools]} if tools else {}),
            )
        except _TemplateRaised as exc:
            raise ChatTemplateError(f"chat template rejected the conversation: {exc}") from exc
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
