"""Prompts to token ids, with the same validation the workers apply.

Tokenising and chat templating run on a small thread pool of their own, never on the event
loop: one long prompt does not stall the other streams. Sizes are checked before
(router/doors/limits.py), so no prompt costs more than its limit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from pdserve.errors import InvalidRequestError
from pdserve.validation import Limits, validate_request
from pdserve.requests import SamplingParams
from pdserve.tokenizer import ChatMessage, Tokenizer
from router.doors.limits import InputLimits


class Frontend:
    def __init__(self, tokenizer: Tokenizer, limits: Limits, inputs: InputLimits = InputLimits(),
                 threads: int = 2):
        self.tokenizer = tokenizer
        self.limits = limits
        self.inputs = inputs
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tokenize")

    async def text(self, text: str) -> list[int]:
        if not text:
            raise InvalidRequestError("the prompt is empty")
        self.inputs.check_text(len(text))
        return await self._off_loop(self.tokenizer.encode, text)

    async def chat(self, messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, object]] = ()) -> list[int]:
        """`tools`: functions the model may call (the template states them)."""
        if not messages:
            raise InvalidRequestError("the chat has no messages")
        for i, m in enumerate(messages):
            if not m.role:
                raise InvalidRequestError(f"chat message {i} has no role")
        chars = sum(len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls) for m in messages)
        self.inputs.check_chat([m.role for m in messages], chars + (len(json.dumps(list(tools))) if tools else 0))
        return await self._off_loop(self.tokenizer.apply_chat_template, list(messages), True, tools)

    def check(self, prompt: list[int], sampling: SamplingParams) -> None:
        validate_request(prompt, sampling, self.limits)

    async def _off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
