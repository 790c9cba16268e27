"""Constraints as grammars, without a model: each kind builds and masks what it should, a bad one
is refused at the door with a message naming the fault, and a matcher walked along the tokens of
a string the grammar accepts ends allowing only the end of sequence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pdserve.errors import InvalidRequestError
from pdserve.grammar import GrammarError, LLGuidanceBackend, bitmask_words, check_constraint
from pdserve.requests import Constraint, ConstraintKind, SamplingParams
from pdserve.tokenizer import load_tokenizer
from pdserve.validation import InvalidSamplingParams, validate_sampling

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items":
          {"type": "string"}}}, "required": ["id", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


@pytest.fixture(scope="module")
def backend(tokenizer):
    return LLGuidanceBackend(tokenizer.tokenizer_json(), 49152, tokenizer.eos_token_ids)


def allowed(backend, matcher) -> set[int]:
    bitmask = np.zeros((1, bitmask_words(backend.vocab_size)), dtype=np.int32)
    backend.fill([matcher], bitmask)
    return set(np.nonzero(np.unpackbits(bitmask.view(np.uint8), bitorder="little"))[0].tolist())


ACCEPTED = [
    (Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA)), '{"id": 7, "tags": ["a", "b c"]}'),
    (Constraint(ConstraintKind.JSON_OBJECT), '{"x": [1, 2.5, null], "y": {"z": true}}'),
    (Constraint(ConstraintKind.REGEX, r"[A-Z]{2}-\d{3}"), "QX-042"),
    (Constraint(ConstraintKind.CHOICE, choices=("red", "green", 'say "blue"')), 'say "blue"'),
    (Constraint(ConstraintKind.GRAMMAR, 'start: "(" item ("," item)* ")"\nitem: /[0-9]+/'), "(1,22,333)"),
    (Constraint(ConstraintKind.GRAMMAR, 'root ::= "go " dir\ndir ::= "north" | "south"'), "go south"),
]


@pytest.mark.parametrize(("constraint", "text"), ACCEPTED, ids=lambda v: getattr(v, "kind", v))
def test_a_string_the_constraint_accepts_walks_to_its_end(backend, tokenizer, constraint, text):
    check_constraint(constraint)
    matcher = backend.matcher(constraint)
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert token in allowed(backend, matcher), (text, tokenizer.decode([token]))
        assert matcher.consume(token) and matcher.error is None
    assert allowed(backend, matcher) == set(tokenizer.eos_token_ids)


def test_a_token_the_grammar_refuses_is_masked_and_breaks_the_matcher(backend, tokenizer):
    matcher = backend.matcher(Constraint(ConstraintKind.REGEX, r"\d+"))
    letter = tokenizer.encode("x", add_special_tokens=False)[0]
    assert letter not in allowed(backend, matcher)
    assert not matcher.consume(letter) and matcher.error


def test_a_batch_fills_each_row_with_its_own_matcher(backend, tokenizer):
    digits = backend.matcher(Constraint(ConstraintKind.REGEX, "[0-9]"))
    yes_no = backend.matcher(Constraint(ConstraintKind.CHOICE, choices=("yes", "no")))
    bitmask = np.zeros((2, bitmask_words(backend.vocab_size)), dtype=np.int32)
    backend.fill([digits, yes_no], bitmask)
    rows = [set(np.nonzero(np.unpackbits(r.view(np.uint8), bitorder="little"))[0].tolist()) for r in bitmask]
    assert {tokenizer.decode([t]) for t in rows[0]} == set("0123456789")
    assert all("yes".startswith(tokenizer.decode([t])) or "no".startswith(tokenizer.decode([t])) for t in rows[1])


REFUSED = [
    (Constraint(ConstraintKind.JSON_SCHEMA, "{not json"), "not JSON"),
    (Constraint(ConstraintKind.JSON_SCHEMA, "[1, 2]"), "must be a JSON object"),
    (Constraint(ConstraintKind.JSON_SCHEMA, '{"type": 5}'), "type"),
    (Constraint(ConstraintKind.REGEX, "[a-"), "regex"),
    (Constraint(ConstraintKind.REGEX, "  "), "empty"),
    (Constraint(ConstraintKind.GRAMMAR, "start: undefined_rule"), "undefined_rule"),
    (Constraint(ConstraintKind.GRAMMAR, "root ::= ("), "GBNF"),
    (Constraint(ConstraintKind.CHOICE), "choice needs 1"),
    (Constraint(ConstraintKind.REGEX, "a" * (256 * 1024 + 1)), "at most"),
]


@pytest.mark.parametrize(("constraint", "says"), REFUSED, ids=lambda v: getattr(v, "kind", str(v)[:12]))
def test_a_bad_constraint_is_refused_with_what_is_wrong(constraint, says):
    with pytest.raises(GrammarError, match=says):
        check_constraint(constraint)
    with pytest.raises(InvalidRequestError, match=says):  # GrammarError is one
        validate_sampling(SamplingParams(constraint=constraint), 49152)


def test_ignore_eos_cannot_go_with_a_constraint():
    with pytest.raises(InvalidSamplingParams, match="ignore_eos"):
        validate_sampling(SamplingParams(ignore_eos=True, constraint=Constraint(ConstraintKind.JSON_OBJECT)), 49152)
