"""What a client asks and what it gets back, without wire types: both public doors (gRPC in
router/doors/servicer.py, HTTP in router/doors/http/) convert to and from these, and
router/doors/gateway.py serves them."""

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


MAX_SAMPLES = 16


@dataclass(frozen=True)
class SampleCount:
    """How many samples to draw and to return (a door checks it with `check_count`)."""

    n: int = 1
    best_of: int | None = None  # draw this many, return the n best (None: n)

    @property
    def drawn(self) -> int:
        return self.best_of or self.n

    @property
    def ranked(self) -> bool:
        return self.drawn > self.n


@dataclass(frozen=True)
class Resume:
    """A stream continued (pdserve/reattach.py): the client has `from_token` of its tokens; they
    are `prior` when it sent them (the gRPC door's prior_token_ids), else None (the OpenAI door's
    Last-Event-ID)."""

    from_token: int
    prior: tuple[int, ...] | None = None


def check_resume(ask: Ask) -> str | None:
    """Why `ask.resume` cannot be served (None when it can, or there is none)."""
    resume = ask.resume
    if resume is None:
        return None
    if not ask.request_id:
        return "a continued stream (resume_from_token, Last-Event-ID) names its request_id"
    if ask.count.drawn != 1:
        return "a stream of n or best_of above 1 cannot be continued"
    if resume.prior is not None and len(resume.prior) != resume.from_token:
        return f"prior_token_ids has {len(resume.prior)} ids; resume_from_token says {resume.from_token}"
    if resume.from_token > ask.sampling.max_tokens:
        return f"resume_from_token {resume.from_token} is beyond max_tokens {ask.sampling.max_tokens}"
    return None


def check_count(count: SampleCount, stream: bool) -> str | None:
    """Why `count` cannot be served (None when it can)."""
    if not 1 <= count.n <= MAX_SAMPLES:
        return f"n must be in [1, {MAX_SAMPLES}], got {count.n}"
    if count.best_of is not None and not count.n <= count.best_of <= MAX_SAMPLES:
        return f"best_of must be in [n={count.n}, {MAX_SAMPLES}], got {count.best_of}"
    if stream and count.ranked:
        return "best_of greater than n cannot be streamed: the best are known only at the end"
    return None


@dataclass(frozen=True)
class Ask:
    prompt: Prompt
    sampling: SamplingParams = field(default_factory=SamplingParams)
    priority: Priority = Priority.NORMAL
    request_id: str = ""  # empty: the gateway makes one
    count: SampleCount = field(default_factory=SampleCount)  # n samples (best_of drawn), router/flow/samples.py
    resume: Resume | None = None  # a stream continued after its client's tokens (check_resume)


@dataclass(frozen=True)
class AskSizes:
    """What the size limits read of a request (router/doors/limits.py), taken off a door's request
    without copying it: a repeated field's length costs nothing, its copy does."""

    request_id: str
    stops: Sequence[str]
    stop_token_ids: int
    token_ids: int | None = None  # a token-id prompt's length
    messages: int | None = None  # a chat's number of messages
    prior_token_ids: int = 0  # a continued stream's tokens the client sent


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
                    len(prompt.messages) if isinstance(prompt, ChatPrompt) else None,
                    len(ask.resume.prior or ()) if ask.resume is not None else 0)


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
    index: int = 0  # which sample (choice) of the request, for n > 1
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()  # on the first output, when asked
