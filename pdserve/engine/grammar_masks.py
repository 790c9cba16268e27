"""Structured output inside a worker's steps: each constrained request's matcher (pdserve/grammar),
brought up to the request's own tokens before it samples, and its mask applied to the logits.

    masks.admit(request)                    # at add: builds its matcher (GrammarError: refused)
    pending = masks.start(requests)         # before the forward pass: masks computed on a thread
    chosen_from = masks.apply(logits, pending, raw)   # after it: disallowed tokens at -inf

A matcher lives as long as its Request (held weakly) and is derived from the request's tokens
alone: built at the grammar's start, it consumes the request's output tokens it has not seen each
time the request samples. So the prefill worker's first token, a decode worker's next ones, a
resume's or a move's continuation on another worker, a preemption by recompute or by swap all
find the grammar where the tokens say, with no grammar state on the wire (catching up costs a
consume per token, microseconds each). The backend (the tokenizer's tables) is built at the first
constrained request, not at start.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from pdserve.checkpoint.model_config import ModelConfig
from pdserve.grammar import GrammarBackend, LLGuidanceBackend, Matcher, bitmask_words
from pdserve.requests import Request
from pdserve.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PendingMasks:
    """One step's masks being computed: row `rows[i]` of the step's sampling rows uses bitmask row i."""

    rows: tuple[int, ...]
    bitmask: np.ndarray  # [len(rows), words] int32
    done: Future
    ends: tuple[tuple[int, ...], ...]  # each row's end-of-sequence ids (what a row left with none takes)


class GrammarMasks:
    def __init__(self, make_backend: Callable[[], GrammarBackend]):
        self._make_backend = make_backend
        self._backend: GrammarBackend | None = None
        self._building = threading.Lock()
        self._matchers: weakref.WeakKeyDictionary[Request, Matcher] = weakref.WeakKeyDictionary()
        self._thread: ThreadPoolExecutor | None = None

    @property
    def backend(self) -> GrammarBackend:
        with self._building:
            if self._backend is None:
                self._backend = self._make_backend()
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
            return self._backend

    def admit(self, request: Request) -> None:
        """Build a constrained request's matcher (GrammarError when its grammar does not build for
        this model's vocabulary); nothing for an unconstrained one."""
        if request.sampling.constraint is not None:
            self._matchers[request] = self.backend.matcher(request.sampling.constraint)

    def start(self, requests: Sequence[Request]) -> PendingMasks | None:
        """The masks of the constrained ones among `requests` (a step's sampling rows), computing."""
        rows = tuple(i for i, r in enumerate(requests) if r.sampling.constraint is not None)
        if not rows:
            return None
        backend = self.backend
        matchers = [self._caught_up(requests[i]) for i in rows]
        bitmask = np.zeros((len(rows), bitmask_words(backend.vocab_size)), dtype=np.int32)
        assert self._thread is not None
        done = self._thread.submit(backend.fill, matchers, bitmask)
        return PendingMasks(rows, bitmask, done, tuple(_ends(requests[i]) for i in rows))

    def apply(self, logits: torch.Tensor, pending: PendingMasks, raw: torch.Tensor) -> torch.Tensor:
        """`logits` ([S, V]) with every disallowed token at -inf: a copy when `logits` is `raw` (the
        step's own, which logprobs read). A row the mask and the request's other rules leave with
        no token (min_tokens barring the end the grammar requires) may end: its EOS ids are 0."""
        pending.done.result()
        out = logits.clone() if logits is raw else logits
        vocab = out.shape[1]
        allowed = np.unpackbits(pending.bitmask.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
        index = torch.tensor(pending.rows, dtype=torch.int64)
        rows = out.index_select(0, index)
        rows.masked_fill_(torch.from_numpy(allowed) == 0, float("-inf"))
        for i in torch.nonzero(torch.isneginf(rows).all(dim=1)).flatten().tolist():
            rows[i, list(pending.ends[i])] = 0.0
        out.index_copy_(0, index, rows)
        return out

    def _caught_up(self, request: Request) -> Matcher:
        matcher = self._matchers.get(request)
        if matcher is None or matcher.consumed > len(request.output_token_ids):
            matcher = self._matchers[request] = self.backend.matcher(request.sampling.constraint)
        for token in request.output_token_ids[matcher.consumed:]:
            matching = matcher.error is None
            if not matcher.consume(token) and matching:
                log.error("request %s: token %d breaks its %s constraint (%s); it may only end now",
                          request.request_id, token, request.sampling.constraint.kind.value,
                          matcher.error.splitlines()[0])
        return matcher


def grammar_backend(model: str | None, config: ModelConfig) -> GrammarBackend:
    """The grammar engine over the tokenizer of `model` (None: the embedded one), for logits of
    the model's width."""
    tokenizer = load_tokenizer(model)
    return LLGuidanceBackend(tokenizer.tokenizer_json(), config.vocab_size, config.eos_token_ids)


def _ends(request: Request) -> tuple[int, ...]:
    return tuple(sorted({*request.eos_token_ids, *request.sampling.stop_token_ids}))
