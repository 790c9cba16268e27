"""`pdserve generate`'s structured-output flags become the request's constraint (a schema or a
grammar from text or from @FILE); at most one of them."""

from __future__ import annotations

import argparse

import pytest

from pdserve.cli.generate import add_parser
from pdserve.cli.options import sampling_params
from pdserve.requests import Constraint, ConstraintKind


def _args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(), "generate")
    return parser.parse_args(["generate", "hello", *flags])


def test_each_flag_names_its_constraint(tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "object"}')
    assert sampling_params(_args()).constraint is None
    assert sampling_params(_args("--json-schema", f"@{schema}")).constraint == Constraint(
        ConstraintKind.JSON_SCHEMA, '{"type": "object"}')
    assert sampling_params(_args("--json-object")).constraint == Constraint(ConstraintKind.JSON_OBJECT)
    assert sampling_params(_args("--regex", "[0-9]+")).constraint == Constraint(ConstraintKind.REGEX, "[0-9]+")
    assert sampling_params(_args("--grammar", 'start: "a"')).constraint == Constraint(ConstraintKind.GRAMMAR,
                                                                                      'start: "a"')
    assert sampling_params(_args("--choice", "a", "--choice", "b")).constraint == Constraint(
        ConstraintKind.CHOICE, choices=("a", "b"))


def test_two_constraints_are_refused():
    with pytest.raises(SystemExit):
        _args("--regex", "a", "--json-object")
