"""A stand-in for the flashinfer module that records every call made through it (constructors,
methods, module functions) and computes nothing: the backend's calls are collected on CPU, to be
checked against flashinfer's signatures. A wrapper's `run` returns zeros shaped like its queries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Call:
    target: str  # "Wrapper" (constructed, or a module function called), "Wrapper.plan" (a method)
    args: tuple
    kwargs: dict[str, Any]


RESULTS: dict[str, Callable[..., Any]] = {"run": lambda q, *rest, **kw: torch.zeros_like(q)}


class RecordingFlashInfer:
    """Put an instance in sys.modules["flashinfer"]; read `calls` afterwards."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def __getattr__(self, name: str) -> type:
        return _recorded_class(name, self.calls)


def _recorded_class(name: str, calls: list[Call]) -> type:
    class Recorded:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            calls.append(Call(name, args, kwargs))

        def __getattr__(self, method: str) -> Callable[..., Any]:
            def record(*args: Any, **kwargs: Any) -> Any:
                calls.append(Call(f"{name}.{method}", args, kwargs))
                return RESULTS.get(method, lambda *a, **k: None)(*args, **kwargs)

            return record

    Recorded.__name__ = name
    return Recorded
