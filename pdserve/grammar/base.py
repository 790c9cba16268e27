"""The interface every grammar engine implements: matchers built from a Constraint, and their
masks written into a caller's bitmask (one int32 word per 32 tokens, bit j of word w: token 32w+j)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from pdserve.errors import InvalidRequestError
from pdserve.requests import Constraint


class GrammarError(InvalidRequestError):
    """A constraint that no grammar can be built from (maps to INVALID_ARGUMENT); the message
    says what is wrong and where."""


def bitmask_words(vocab_size: int) -> int:
    """int32 words of one row of a bitmask over `vocab_size` tokens."""
    return (vocab_size + 31) // 32


class Matcher(ABC):
    """One constrained request's place in its grammar."""

    consumed: int = 0  # the request's output tokens fed so far

    @abstractmethod
    def consume(self, token_id: int) -> bool:
        """Advance past `token_id`; False (and `error` set, for good) when the grammar refuses it."""

    @property
    @abstractmethod
    def error(self) -> str | None:
        """Why the matcher stopped matching (a token it refused); None while it matches."""


class GrammarBackend(ABC):
    """A grammar engine bound to one model's tokenizer."""

    vocab_size: int

    @abstractmethod
    def matcher(self, constraint: Constraint) -> Matcher:
        """A fresh matcher at the grammar's start; GrammarError for a constraint it cannot build."""

    @abstractmethod
    def fill(self, matchers: Sequence[Matcher], bitmask: np.ndarray) -> None:
        """Row i of `bitmask` ([len(matchers), bitmask_words(vocab_size)] int32, C-contiguous): the
        tokens matcher i allows next (its end-of-sequence tokens once the grammar is complete). May
        run off the engine's thread, while the model computes: it reads the matchers only."""
