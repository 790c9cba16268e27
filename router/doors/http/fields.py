"""Typed reads of a JSON body's fields: a wrong type is InvalidRequestError naming the field."""

from __future__ import annotations

import math
from typing import Any

from pdserve.errors import InvalidRequestError

Body = dict[str, Any]


def number(body: Body, key: str, default: float | None) -> float | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"{key} must be a number, got {_shown(value)}")
    return float(value)


def integer(body: Body, key: str, default: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{key} must be an integer, got {_shown(value)}")
    return value


def boolean(body: Body, key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{key} must be true or false, got {_shown(value)}")
    return value


def string(body: Body, key: str, default: str | None) -> str | None:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidRequestError(f"{key} must be a string, got {_shown(value)}")
    return value


def strings(body: Body, key: str) -> tuple[str, ...]:
    """A string or a list of strings (OpenAI's `stop`)."""
    value = body.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise InvalidRequestError(f"{key} must be a string or a list of strings")


def integers(body: Body, key: str) -> tuple[int, ...]:
    value = body.get(key)
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    raise InvalidRequestError(f"{key} must be a list of integers")


def unsupported(body: Body, defaults: dict[str, Any]) -> None:
    """Refuses an OpenAI field pdserve does not implement, unless it has its no-op value."""
    for key, neutral in defaults.items():
        value = body.get(key)
        if value is not None and value != neutral:
            raise InvalidRequestError(f"{key} is not supported (only {neutral!r})")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
