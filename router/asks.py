"""What a client asks and what it gets back, without wire types: both public doors (gRPC in
router/servicer.py, HTTP in router/http/) convert to and from these, and router/gateway.py serves them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pdserve.requests import FinishReason, Priority, SamplingParams, Usage
from pdserve.tokenizer import ChatMessage

if TYPE_CHECKING:
    from pdserve.requests import TokenLogprobs


@dataclass(frozen=True)
class TextPrompt:
    """The caller's own formatted prompt: special tokens in it stay control tokens."""

    text: str


@dataclass(frozen=True)
class TokenPrompt:
    ids: Sequence[int]


@dataclass(frozen=True)
class ChatPrompt:
    """Rendered with the model's chat template; special tokens inside contents are plain text."""

    messages: Sequence[ChatMessage]
    tools: Sequence[Mapping[str, object]] = ()  # functions the model may call, stated by the template


Prompt = TextPrompt | TokenPrompt | ChatPrompt


@dataclass(frozen=True)
class Ask:
    prompt: Prompt
    sampling: SamplingParams = field(default_factory=SamplingParams)
    priority: Priority = Priority.NORMAL
    request_id: str = ""  # empty: the gateway makes one


@dataclass(frozen=True)
class AskSizes:
    """What the size limits read of a request (router/limits.py), taken off a door's request
    without copying it: a repeated field's length costs nothing, its copy does."""

    request_id: str
    stops: Sequence[str]
    stop_token_ids: int
    token_ids: int | None = None  # a token-id prompt's length
    messages: int | None = None  # a chat's number of messages


class AskSource(Protocol):
    """A door's request on its way in: the gateway checks `sizes()` first, then converts it with
    `ask()`; either may raise InvalidRequestError."""

    def sizes(self) -> AskSizes: ...

    def ask(self) -> Ask: ...


def sizes_of(ask: Ask) -> AskSizes:
    """The sizes of a request a door has converted already (its input was bounded before)."""
    prompt = ask.prompt
    return AskSizes(ask.request_id, ask.sampling.stop, len(ask.sampling.stop_token_ids),
                    len(prompt.ids) if isinstance(prompt, TokenPrompt) else None,
                    len(prompt.messages) if isinstance(prompt, ChatPrompt) else None)


@dataclass(frozen=True)
class Finish:
    reason: FinishReason
    usage: Usage


@dataclass(frozen=True)
class Output:
    """Tokens and text since the previous output; `finish` on the last one only. `logprobs`,
    when asked, has one entry per token id."""

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprobs, ...] = ()
    finish: Finish | None = None
