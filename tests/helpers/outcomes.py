"""A call's result or the PdserveError it raised, as a value: for streams run side by side in
threads, whose failures are part of what a test asserts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pdserve.client import PdserveError

T = TypeVar("T")


def outcome(call: Callable[..., T], *args, **kwargs) -> T | PdserveError:
    try:
        return call(*args, **kwargs)
    except PdserveError as exc:
        return exc


def succeeded(results: list[T | PdserveError]) -> list[T]:
    """The results, once none of them is an error (else the first error fails the test)."""
    errors = [r for r in results if isinstance(r, PdserveError)]
    assert not errors, errors[0]
    return results
