"""The tokenizer interface the engine talks to, and the types around it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolCall:
    """A function call an assistant turn made: `arguments` is a JSON object's text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation, as the chat template sees it: an assistant turn may carry the
    function calls it made, a `tool` turn the id of the call whose result it is."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


Tools = Sequence[Mapping[str, object]]  # OpenAI's tools: {"type": "function", "function": {name, description, parameters}}


MessageLike = ChatMessage | Mapping[str, object]


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered: a malformed message, a role the template rejects,
    a broken template, or a model without a chat template."""


class UnsupportedTokenizerError(ValueError):
    """The model names a tokenizer kind this package cannot build."""


class Tokenizer(ABC):
    """Text <-> token ids for one model, plus its chat template.

    Implementations are immutable after construction and safe to share between threads.
    """

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`, a prompt its caller formatted. Special-token strings in `text`
        (e.g. `<|im_start|>`) become their ids; `add_special_tokens` adds what the model's
        post-processor adds (BOS for some)."""

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; invalid UTF-8 byte runs come out as U+FFFD."""

    @abstractmethod
    def render_chat(self, messages: Sequence[MessageLike], add_generation_prompt: bool = True,
                    tools: Tools = ()) -> str:
        """The conversation as prompt text, through the model's chat template; `tools`, the
        functions the model may call, through the template's own tool section, or where it has
        none stated in a system message (pdserve/tokenizer/tool_prompt.py).

        Raises ChatTemplateError for a malformed message, a template error (including the
        template's own `raise_exception`), or a model without a chat template: there is no
        guessed format, because a guessed one silently degrades answers (the one fallback is an
        architecture's own documented format, for a GGUF file that leaves it out: chat_fallback.py).

        NOTE: the text does not say which special-token strings the template wrote: `encode` of
        it would turn strings typed into messages into control tokens. Use `apply_chat_template`.
        """

    @abstractmethod
    def apply_chat_template(
        self, messages: Sequence[MessageLike], add_generation_prompt: bool = True, tools: Tools = ()
    ) -> list[int]:
        """Token ids of the conversation through the chat template.

        Special-token strings the template writes (its turn markers, `bos_token`, `eos_token`)
        are control tokens; the same strings inside a message's role or content are plain text,
        so a message cannot forge a turn. Joins between the two tokenise as in one text: a
        conversation without special strings in its messages gets `encode(render_chat(...),
        add_special_tokens=False)`. Nothing is added on top of what the template writes.
        Raises ChatTemplateError as `render_chat` does.
        """

    def tokenizer_json(self) -> str:
        """The tokenizer as a `tokenizers` tokenizer.json text (what grammar engines read)."""
        raise UnsupportedTokenizerError(f"{type(self).__name__} has no tokenizer.json form")

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""

    @property
    @abstractmethod
    def bos_token_id(self) -> int | None:
        """Beginning-of-sequence id, or None when the model has none."""

    @property
    @abstractmethod
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends a generation (EOS, end-of-turn), first the primary EOS."""

    @property
    @abstractmethod
    def special_token_ids(self) -> frozenset[int]:
        """Ids that `decode(..., skip_special_tokens=True)` leaves out."""
