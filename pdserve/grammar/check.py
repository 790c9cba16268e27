"""A constraint's check at the door: does a grammar build from it? (No tokenizer: the router and
every worker agree on a constraint's validity whatever model they serve.)"""

from __future__ import annotations

import functools

from pdserve.grammar.base import GrammarError
from pdserve.grammar.source import grammar_source
from pdserve.requests import Constraint, ConstraintKind

MAX_SPEC_CHARS = 256 * 1024  # a schema, regex or grammar's text
MAX_CHOICES = 1024


def check_constraint(constraint: Constraint) -> None:
    """Raise GrammarError naming what is wrong; return None for a constraint a grammar builds from."""
    if (message := _size(constraint)) is not None:
        raise GrammarError(message)
    if (message := _build(constraint)) is not None:
        raise GrammarError(message)


def _size(c: Constraint) -> str | None:
    if len(c.spec) > MAX_SPEC_CHARS:
        return f"the {c.kind.value} constraint has {len(c.spec)} characters, at most {MAX_SPEC_CHARS}"
    if c.kind is ConstraintKind.CHOICE and not 1 <= len(c.choices) <= MAX_CHOICES:
        return f"choice needs 1 to {MAX_CHOICES} strings, got {len(c.choices)}"
    if c.kind not in (ConstraintKind.JSON_OBJECT, ConstraintKind.CHOICE) and not c.spec.strip():
        return f"the {c.kind.value} constraint is empty"
    return None


@functools.lru_cache(maxsize=64)  # at most 64 x MAX_SPEC_CHARS held
def _build(constraint: Constraint) -> str | None:
    """The reason no grammar builds from `constraint`, or None (kept: clients repeat their schemas)."""
    import llguidance

    try:
        source = grammar_source(constraint)
    except ValueError as exc:
        return str(exc)
    error = llguidance.LLMatcher.validate_grammar(source)
    return f"the {constraint.kind.value} constraint does not build a grammar: {error}" if error else None
