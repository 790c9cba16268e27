"""The Tokenizer both loaders build: a `tokenizers.Tokenizer` plus special ids and a template."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer as Backend

from pdserve.tokenizer.base import ChatTemplateError, MessageLike, Tokenizer, Tools
from pdserve.tokenizer.chat_specials import SpecialStrings
from pdserve.tokenizer.chat_template import ChatTemplate
from pdserve.tokenizer.parts_encoder import PartsEncoder
from pdserve.tokenizer.tool_prompt import plain_messages


@dataclass(frozen=True)
class SpecialTokens:
    """What a model's files say about its special tokens."""

    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]


class FastTokenizer(Tokenizer):
    """A Tokenizer over the Rust `tokenizers` backend. Subclasses only build the parts."""

    def __init__(self, backend: Backend, specials: SpecialTokens, chat_template: ChatTemplate | None) -> None:
        self._backend = backend
        self._specials = specials
        self._chat_template = chat_template
        added = backend.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, tok in added.items() if tok.special)
        self._special_strings = SpecialStrings(added[i].content for i in self._special_ids)
        self._parts_encoder = PartsEncoder(backend)

    @property
    def backend(self) -> Backend:
        return self._backend

    def tokenizer_json(self) -> str:
        return self._backend.to_str()

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self._chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: Sequence[MessageLike], add_generation_prompt: bool = True,
                    tools: Tools = ()) -> str:
        template = self._template()
        if not template.handles_tools:
            messages, tools = plain_messages(messages, tools), ()
        return template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._token_text(self.bos_token_id),
            eos_token=self._token_text(self.eos_token_ids[0] if self.eos_token_ids else None),
            tools=tools,
        )

    def apply_chat_template(
        self, messages: Sequence[MessageLike], add_generation_prompt: bool = True, tools: Tools = ()
    ) -> list[int]:
        template = self._template()
        if not template.handles_tools:
            messages, tools = plain_messages(messages, tools), ()
        chat = self._special_strings.escape(messages, template.source, tools)
        rendered = self.render_chat(chat.messages, add_generation_prompt, chat.tools)
        return self._parts_encoder.encode(self._special_strings.split(rendered, chat))

    def _template(self) -> ChatTemplate:
        if self._chat_template is None:
            raise ChatTemplateError("this model has no chat template: send a plain-text prompt instead")
        return self._chat_template

    def _token_text(self, token_id: int | None) -> str:
        if token_id is None:
            return ""
        return self._backend.id_to_token(token_id) or ""

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return self._specials.bos_token_id

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._specials.eos_token_ids

    @property
    def special_token_ids(self) -> frozenset[int]:
        return self._special_ids
