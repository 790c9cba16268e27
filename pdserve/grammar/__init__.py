"""Structured output: a request's Constraint (pdserve/requests.py) turned into a grammar, and one
matcher per constrained request that says which tokens may come next.

    check_constraint(constraint)               # at the door: GrammarError for a bad one
    backend = LLGuidanceBackend(tokenizer_json, vocab_size, eos_token_ids)
    matcher = backend.matcher(constraint)      # its state: the tokens it consumed
    backend.fill([matcher, ...], bitmask)      # row i: a bit per token matcher i allows next

The engine applies the masks to the logits before any token is chosen (pdserve/engine/grammar_masks.py).
No torch here: the router checks constraints with this package alone.
"""

from pdserve.grammar.base import GrammarBackend, GrammarError, Matcher, bitmask_words
from pdserve.grammar.check import check_constraint
from pdserve.grammar.llguidance_backend import LLGuidanceBackend

__all__ = ["GrammarBackend", "GrammarError", "LLGuidanceBackend", "Matcher", "bitmask_words", "check_constraint"]
