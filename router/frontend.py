"""Prompts to token ids, with the same validation the workers apply."""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.engine.errors import InvalidRequestError
from pdserve.engine.validation import Limits, validate_request
from pdserve.requests import SamplingParams
from pdserve.tokenizer import ChatMessage, Tokenizer


class Frontend:
    def __init__(self, tokenizer: Tokenizer, limits: Limits):
        self.tokenizer = tokenizer
        self.limits = limits

    def text(self, text: str) -> list[int]:
        if not text:
            raise InvalidRequestError("the prompt is empty")
        return self.tokenizer.encode(text)

    def chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        if not messages:
            raise InvalidRequestError("the chat has no messages")
        for i, m in enumerate(messages):
            if not m.role:
                raise InvalidRequestError(f"chat message {i} has no role")
        return self.tokenizer.apply_chat_template(list(messages))

    def check(self, prompt: list[int], sampling: SamplingParams) -> None:
        validate_request(prompt, sampling, self.limits)
