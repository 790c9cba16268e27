"""The serving dtype: the `--dtype` name resolved against what the device supports.

`auto` is bfloat16 on CUDA (float16 where the GPU has no bfloat16) and float32 elsewhere. The
resolution takes the device's facts as a value, so every branch is testable without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdserve.config import DTYPE_NAMES


@dataclass(frozen=True)
class DeviceFacts:
    """What the dtype choice needs to know about a device."""

    kind: str  # torch.device(...).type: "cpu", "cuda", ...
    bf16_supported: bool = False

    @classmethod
    def probe(cls, device: str | torch.device) -> DeviceFacts:
        """Ask torch about `device` (CUDA is only queried for a CUDA device)."""
        kind = torch.device(device).type
        if kind != "cuda":
            return cls(kind)
        return cls(kind, bf16_supported=torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def resolve_dtype(name: str, facts: DeviceFacts) -> torch.dtype:
    """The torch dtype `name` (one of DTYPE_NAMES) means on a device with these facts."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPE_NAMES)}")
    if name != "auto":
        return getattr(torch, name)
    if facts.kind != "cuda":
        return torch.float32
    return torch.bfloat16 if facts.bf16_supported else torch.float16


def serving_dtype(name: str, device: str | torch.device) -> torch.dtype:
    """resolve_dtype for the device named, probed now."""
    return resolve_dtype(name, DeviceFacts.probe(device))
