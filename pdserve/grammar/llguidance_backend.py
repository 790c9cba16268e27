"""The grammar engine on llguidance (Microsoft's, in Rust; vLLM's and SGLang's too): a matcher's
mask costs tens of microseconds per token and a grammar builds in under a millisecond, with no
precompiled per-vocabulary tables (benchmarks/grammar_engines.py, docs/BENCHMARKS.md)."""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from pdserve.grammar.base import GrammarBackend, GrammarError, Matcher, bitmask_words
from pdserve.grammar.source import grammar_source
from pdserve.requests import Constraint

CACHED_GRAMMARS = 64  # built matchers kept to copy from: clients repeat their schemas


class LLGuidanceMatcher(Matcher):
    def __init__(self, inner) -> None:
        self.inner = inner  # an llguidance.LLMatcher
        self.consumed = 0

    def consume(self, token_id: int) -> bool:
        self.consumed += 1
        return self.inner.consume_token(token_id)

    @property
    def error(self) -> str | None:
        return self.inner.get_error() if self.inner.is_error() else None


class LLGuidanceBackend(GrammarBackend):
    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int]):
        """`tokenizer_json`: the model's tokenizer.json text; `vocab_size`: the logits' width (at
        least the tokenizer's); `eos_token_ids`: what the grammar allows once it is complete."""
        import llguidance

        self._llguidance = llguidance
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids))
        self._executor = llguidance.LLExecutor()
        self._built: collections.OrderedDict[Constraint, object] = collections.OrderedDict()

    def matcher(self, constraint: Constraint) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._start(constraint).deep_copy())

    def _start(self, constraint: Constraint):
        built = self._built.get(constraint)
        if built is None:
            try:
                built = self._llguidance.LLMatcher(self.tokenizer, grammar_source(constraint), log_level=0)
            except ValueError as exc:
                raise GrammarError(str(exc)) from None
            if built.is_error():
                raise GrammarError(f"the {constraint.kind.value} constraint does not build a grammar: "
                                   f"{built.get_error()}")
            self._built[constraint] = built
            while len(self._built) > CACHED_GRAMMARS:
                self._built.popitem(last=False)
        self._built.move_to_end(constraint)
        return built

    def fill(self, matchers: Sequence[Matcher], bitmask: np.ndarray) -> None:
        words = bitmask_words(self.vocab_size)
        assert bitmask.dtype == np.int32 and bitmask.flags.c_contiguous and bitmask.shape == (len(matchers), words)
        pairs = [(m.inner, row) for row, m in enumerate(matchers)]  # type: ignore[attr-defined]
        self._executor.unsafe_compute_mask_ptr(pairs, bitmask.ctypes.data, words * 4, len(matchers))
