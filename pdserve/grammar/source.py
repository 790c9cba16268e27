"""A Constraint as llguidance's grammar text (JSON schemas, regular expressions, Lark, GBNF, choices)."""

from __future__ import annotations

import json

from pdserve.requests import Constraint, ConstraintKind

# JSON as a model writes it readably and the grammar keeps finite: one space after ':' and ','
# (no free whitespace, so no run of blanks at a high temperature), keys in the schema's order.
JSON_OPTIONS = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def grammar_source(constraint: Constraint) -> str:
    """llguidance's grammar for `constraint`; ValueError for a spec that is not even its kind's text
    (a schema that is not JSON). A grammar that does not build is found by the matcher."""
    import llguidance

    kind = constraint.kind
    if kind is ConstraintKind.JSON_SCHEMA:
        return llguidance.LLMatcher.grammar_from_json_schema(_schema(constraint.spec), defaults=JSON_OPTIONS)
    if kind is ConstraintKind.JSON_OBJECT:
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if kind is ConstraintKind.REGEX:
        return llguidance.LLMatcher.grammar_from_regex(constraint.spec)
    if kind is ConstraintKind.GRAMMAR:
        return llguidance.LLMatcher.grammar_from_lark(_lark(constraint.spec))
    return llguidance.LLMatcher.grammar_from_lark(_choices(constraint.choices))


def _schema(spec: str) -> dict:
    try:
        schema = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise ValueError(f"json_schema is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"json_schema must be a JSON object, got {type(schema).__name__}")
    return schema


def _lark(spec: str) -> str:
    """Lark as it is; GBNF (rules written `name ::= ...`, start rule `root`) converted."""
    if "::=" not in spec:
        return spec
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        return gbnf_to_lark(spec)
    except Exception as exc:  # the converter raises plain exceptions for GBNF it cannot read
        raise ValueError(f"the GBNF grammar does not parse: {exc}") from None


def _choices(choices: tuple[str, ...]) -> str:
    """A Lark grammar accepting exactly one of `choices` (JSON string escapes are Lark's too)."""
    if not choices:
        raise ValueError("choice needs at least one string")
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
