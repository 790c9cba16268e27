"""The serving dtype: the `--dtype` name resolved against what the device supports; and the KV
pool's (`--kv-cache-dtype`) against the serving dtype.

`auto` is bfloat16 on CUDA (float16 where the GPU has no bfloat16) and float32 elsewhere. The
resolution takes the device's facts as a value, so every branch is testable without a GPU.

The KV pool holds the serving dtype (`auto`), or, below a float32 model on a CPU, bfloat16 or
float16: keys and values rounded to nearest as they are stored, widened back as attention reads
them (every sum in float32), so the pool, its swaps and its transfers take half the bytes and a
decode step reads half the KV (on a CPU the decode attention is bound by that read).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdserve.attention.selection import HALF_DTYPES
from pdserve.config import DTYPE_NAMES, KV_DTYPE_NAMES


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


def resolve_kv_dtype(name: str, serving: torch.dtype, facts: DeviceFacts) -> torch.dtype:
    """The KV pool's dtype for `name` (one of KV_DTYPE_NAMES) below a model serving in `serving`.
    ValueError for a pool attention cannot read there: another dtype than the model's, unless a
    half one below a float32 model on a CPU."""
    if name not in KV_DTYPE_NAMES:
        raise ValueError(f"unknown KV cache dtype {name!r}; choose one of {', '.join(KV_DTYPE_NAMES)}")
    if name == "auto":
        return serving
    dtype = getattr(torch, name)
    if dtype == serving or (facts.kind == "cpu" and serving == torch.float32 and dtype in HALF_DTYPES):
        return dtype
    raise ValueError(f"a {name} KV cache below a {str(serving).removeprefix('torch.')} model on {facts.kind}: "
                     "the KV cache holds the model's dtype, or bfloat16 or float16 below a float32 model on a CPU")


def kv_cache_dtype(name: str, serving: torch.dtype, device: str | torch.device) -> torch.dtype:
    """resolve_kv_dtype for the device named, probed now."""
    return resolve_kv_dtype(name, serving, DeviceFacts.probe(device))
