"""The in-process text API over one Engine: prompts in, streamed text out.

    llm = LLM(EngineConfig())                      # the embedded SmolLM2
    for piece in llm.stream("What is the capital of France?", SamplingParams(temperature=0)):
        print(piece.text, end="")

    with LLM(EngineConfig(tensor_parallel_size=3)) as llm:   # ranks 1 and 2 stop on leaving
        ...
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pdserve.config import EngineConfig
from pdserve.engine.engine import Engine
from pdserve.engine.text_stream import TextStream
from pdserve.engine.outputs import RequestOutput
from pdserve.requests import FinishReason, Priority, Request, SamplingParams, TokenLogprobs
from pdserve.tokenizer import ChatMessage, Tokenizer, load_tokenizer

Prompt = str | Sequence[int] | Sequence[ChatMessage]


@dataclass(frozen=True)
class StreamPiece:
    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None  # set on the last piece
    logprobs: tuple[TokenLogprobs, ...] = ()  # one per token id when sampling.logprobs is set


@dataclass(frozen=True)
class Completion:
    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    preemptions: int
    logprobs: tuple[TokenLogprobs, ...] = ()  # one per token id when sampling.logprobs is set


class LLM:
    def __init__(self, config: EngineConfig, tokenizer: Tokenizer | None = None, engine: Engine | None = None):
        self.engine = engine or Engine(config)
        self.tokenizer = tokenizer or load_tokenizer(config.model)
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop the engine's other tensor-parallel ranks (nothing to do at size 1)."""
        self.engine.loaded.ranks.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if prompt and isinstance(prompt[0], ChatMessage):
            return self.tokenizer.apply_chat_template(prompt)
        return [int(t) for t in prompt]

    def stream(self, prompt: Prompt, sampling: SamplingParams = SamplingParams(),
               priority: Priority = Priority.NORMAL) -> Iterator[StreamPiece]:
        """Run one request alone (other requests already added keep running beside it)."""
        request = self._add(prompt, sampling, priority)
        text = TextStream(self.tokenizer, request.prompt_token_ids, sampling.stop)
        while True:
            for out in self.engine.step().outputs:
                if out.request is request:
                    yield from self._pieces(out, text)
                    if out.finished or text.stopped:
                        return

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams = SamplingParams()) -> list[Completion]:
        """Run all prompts together (continuous batching); completions in prompt order."""
        requests = [self._add(p, sampling, Priority.NORMAL) for p in prompts]
        streams = {r.request_id: TextStream(self.tokenizer, r.prompt_token_ids, sampling.stop) for r in requests}
        texts = {r.request_id: [] for r in requests}
        logprobs = {r.request_id: [] for r in requests}
        while any(not r.is_finished for r in requests):
            for out in self.engine.step().outputs:
                pieces = self._pieces(out, streams[out.request_id])
                texts[out.request_id].extend(p.text for p in pieces)
                logprobs[out.request_id].extend(out.logprobs)
        return [self._completion(r, "".join(texts[r.request_id]), tuple(logprobs[r.request_id])) for r in requests]

    def _add(self, prompt: Prompt, sampling: SamplingParams, priority: Priority) -> Request:
        return self.engine.add_request(f"llm-{next(self._ids)}", self.encode(prompt), sampling, priority)

    def _pieces(self, out: RequestOutput, text: TextStream) -> list[StreamPiece]:
        request, new, finished = out.request, out.new_token_ids, out.finished
        delta = text.push(new)
        if delta.stopped and not request.is_finished:
            self.engine.finish(request.request_id, FinishReason.STOP)
        if delta.stopped or finished:
            tail = "" if delta.stopped else text.finish()
            reason = FinishReason.STOP if delta.stopped else request.finish_reason
            return [StreamPiece(request.request_id, delta.text + tail, new, reason, out.logprobs)]
        return [StreamPiece(request.request_id, delta.text, new, None, out.logprobs)]

    @staticmethod
    def _completion(request: Request, text: str, logprobs: tuple[TokenLogprobs, ...]) -> Completion:
        return Completion(request.request_id, text, tuple(request.output_token_ids),
                          request.finish_reason or FinishReason.ABORT, request.num_prompt_tokens,
                          request.num_cached_tokens, request.num_preemptions, logprobs)
