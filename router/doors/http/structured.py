"""An OpenAI body's structured-output constraint: OpenAI's `response_format` (`json_schema`,
`json_object`, `text`), and vLLM's extra fields for clients written against it: `structured_outputs`
({"json" | "regex" | "choice" | "grammar" | "json_object": ...}) and the older `guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar`. At most one constraint per request; what it
holds is checked with the other sampling settings (pdserve/validation.py)."""

from __future__ import annotations

import json

from pdserve.errors import InvalidRequestError
from pdserve.requests import Constraint, ConstraintKind
from router.doors.http.fields import Body

# vLLM's names -> the constraint's kind
_STRUCTURED_OUTPUTS = {"json": ConstraintKind.JSON_SCHEMA, "regex": ConstraintKind.REGEX,
                       "choice": ConstraintKind.CHOICE, "grammar": ConstraintKind.GRAMMAR,
                       "json_object": ConstraintKind.JSON_OBJECT}
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
# vLLM's options beside the constraint in structured_outputs: how its backends build it. pdserve's
# JSON has no free whitespace and follows the schema's additionalProperties; these are accepted
# and change nothing.
_VLLM_OPTIONS = {"disable_fallback", "disable_any_whitespace", "disable_additional_properties", "whitespace_pattern",
                 "backend"}


def constraint_of(body: Body) -> Constraint | None:
    found = [c for c in (_response_format(body.get("response_format")), *_vllm(body)) if c is not None]
    if len(found) > 1:
        raise InvalidRequestError("set one structured-output constraint: response_format, structured_outputs "
                                  "and guided_* name several")
    return found[0] if found else None


def _response_format(value) -> Constraint | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise InvalidRequestError("response_format must be an object with a type: text, json_object or json_schema")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(ConstraintKind.JSON_OBJECT)
    if kind != "json_schema":
        raise InvalidRequestError(f"response_format.type must be text, json_object or json_schema, got {kind!r}")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise InvalidRequestError("response_format json_schema needs json_schema.schema, a JSON schema object")
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(spec["schema"]))


def _vllm(body: Body) -> list[Constraint | None]:
    fields = [(field, name, body.get(field)) for field, name in _GUIDED.items() if body.get(field) is not None]
    outputs = body.get("structured_outputs")
    if outputs is not None:
        if not isinstance(outputs, dict):
            raise InvalidRequestError("structured_outputs must be an object: json, regex, choice, grammar or "
                                      "json_object")
        fields += [(f"structured_outputs.{name}", name, value) for name, value in outputs.items()
                   if value is not None and name not in _VLLM_OPTIONS]
    return [_named(field, name, value) for field, name, value in fields]


def _named(field: str, name: str, value) -> Constraint | None:
    """`field` as the body names it; `name`: vLLM's name of the constraint."""
    kind = _STRUCTURED_OUTPUTS.get(name)
    if kind is None:
        raise InvalidRequestError(f"{field} is not a constraint pdserve knows: {', '.join(_STRUCTURED_OUTPUTS)}")
    if kind is ConstraintKind.JSON_OBJECT:
        return Constraint(kind) if value is True else None
    if kind is ConstraintKind.CHOICE:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidRequestError(f"{field} must be a list of strings")
        return Constraint(kind, choices=tuple(value))
    if kind is ConstraintKind.JSON_SCHEMA and isinstance(value, dict):
        return Constraint(kind, json.dumps(value))
    if not isinstance(value, str):
        raise InvalidRequestError(f"{field} must be a string" + (" or a JSON schema object" if name == "json" else ""))
    return Constraint(kind, value)
