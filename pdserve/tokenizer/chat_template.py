"""Chat templates: Jinja2 source rendered in a sandbox.

The environment follows the conventions model authors write templates for: blocks trimmed,
`loopcontrols` enabled, `raise_exception(msg)`, `strftime_now(fmt)` and a `tojson` that keeps
non-ASCII characters. Variables: `messages`, `add_generation_prompt`, `bos_token`, `eos_token`.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence

import jinja2
import jinja2.ext
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


def message_dict(message: MessageLike, index: int) -> dict[str, str]:
    """A message as the template indexes it; ChatTemplateError when role or content is bad."""
    if isinstance(message, ChatMessage):
        role, content = message.role, message.content
    elif isinstance(message, Mapping):
        role, content = message.get("role"), message.get("content")
    else:
        kind = type(message).__name__
        raise ChatTemplateError(f"message {index}: expected a ChatMessage or a mapping, got {kind}")
    if not isinstance(role, str) or not role:
        raise ChatTemplateError(f"message {index}: 'role' must be a non-empty string, got {role!r}")
    if not isinstance(content, str):
        raise ChatTemplateError(f"message {index}: 'content' must be a string, got {type(content).__name__}")
    return {"role": role, "content": content}


class ChatTemplate:
    """One compiled chat template. Rendering is thread-safe."""

    def __init__(self, source: str) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        self.source = source

    def render(
        self,
        messages: Sequence[MessageLike],
        add_generation_prompt: bool,
        bos_token: str,
        eos_token: str,
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
            )
        except _TemplateRaised as exc:
            raise ChatTemplateError(f"chat template rejected the conversation: {exc}") from exc
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
