"""Structured output in OpenAI bodies, without a server: OpenAI's response_format and vLLM's
structured_outputs and guided_* fields become one Constraint; a malformed or doubled one is
refused naming the field."""

from __future__ import annotations

import json

import pytest

from pdserve.errors import InvalidRequestError
from pdserve.requests import Constraint, ConstraintKind
from router.doors.http.openai_requests import chat_request, completion_request

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def _constraint(body) -> Constraint | None:
    return chat_request({"messages": [{"role": "user", "content": "hi"}], **body}, {}, "m").ask.sampling.constraint


@pytest.mark.parametrize(("body", "expected"), [
    ({}, None),
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, Constraint(ConstraintKind.JSON_OBJECT)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA))),
    ({"structured_outputs": {"json": SCHEMA}}, Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA))),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA))),
    ({"structured_outputs": {"regex": "[a-z]+"}}, Constraint(ConstraintKind.REGEX, "[a-z]+")),
    ({"structured_outputs": {"choice": ["a", "b"]}}, Constraint(ConstraintKind.CHOICE, choices=("a", "b"))),
    ({"structured_outputs": {"grammar": "start: \"x\""}}, Constraint(ConstraintKind.GRAMMAR, 'start: "x"')),
    ({"structured_outputs": {"json_object": True}}, Constraint(ConstraintKind.JSON_OBJECT)),
    ({"structured_outputs": {"regex": "a+", "disable_any_whitespace": True, "backend": "xgrammar"}},
     Constraint(ConstraintKind.REGEX, "a+")),
    ({"guided_json": SCHEMA}, Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA))),
    ({"guided_regex": "\\d+"}, Constraint(ConstraintKind.REGEX, "\\d+")),
    ({"guided_choice": ["yes", "no"]}, Constraint(ConstraintKind.CHOICE, choices=("yes", "no"))),
    ({"guided_grammar": "root ::= \"a\""}, Constraint(ConstraintKind.GRAMMAR, 'root ::= "a"')),
])
def test_each_way_of_asking_becomes_its_constraint(body, expected):
    assert _constraint(body) == expected


def test_a_completion_takes_a_constraint_too():
    body = {"prompt": "Answer:", "guided_choice": ["yes", "no"]}
    assert completion_request(body, {}, "m").ask.sampling.constraint == Constraint(ConstraintKind.CHOICE,
                                                                                    choices=("yes", "no"))


@pytest.mark.parametrize(("body", "needle"), [
    ({"response_format": "json"}, "response_format must be an object"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": "x"}}}, "json_schema.schema"),
    ({"structured_outputs": ["json"]}, "structured_outputs must be an object"),
    ({"structured_outputs": {"yaml": "x"}}, "structured_outputs.yaml"),
    ({"guided_choice": "yes"}, "guided_choice must be a list of strings"),
    ({"guided_regex": 5}, "guided_regex must be a string"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "set one structured-output constraint"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "set one structured-output constraint"),
])
def test_a_malformed_or_doubled_constraint_is_refused_naming_the_field(body, needle):
    with pytest.raises(InvalidRequestError, match=needle):
        _constraint(body)
