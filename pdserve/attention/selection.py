"""Which attention backend runs: a pure choice from the name asked for and what stops flashinfer
here (`flashinfer_problem` probes that), so every branch is testable without a GPU."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdserve.attention.pool_rows import SUPPORTED_DTYPES
from pdserve.config import ATTENTION_BACKENDS

HALF_DTYPES = (torch.float16, torch.bfloat16)
BATCHED_DTYPES = SUPPORTED_DTYPES  # what torch-batched computes


def batched_reads(pool: torch.dtype | None, compute: torch.dtype | None = None) -> bool:
    """Whether torch-batched serves a pool of `pool` below a model computing in `compute` (None:
    the pool's): one it computes in, or a half pool below a float32 model (widened as read)."""
    compute = pool if compute is None else compute
    return (pool in BATCHED_DTYPES and compute == pool) or (pool in HALF_DTYPES and compute == torch.float32)


class AttentionBackendUnavailable(RuntimeError):
    """The named backend cannot run here (no CUDA, flashinfer not installed, unsupported dtype)."""


@dataclass(frozen=True)
class BackendChoice:
    """The backend to build, and, when `auto` on a CUDA device could not have flashinfer, why
    (`fallback`: the engine logs it as a warning; on a CPU torch is expected and says nothing)."""

    name: str  # torch | flashinfer | torch-batched
    fallback: str | None = None


def choose_backend(name: str, device_kind: str, flashinfer_problem: str | None,
                   dtype: torch.dtype | None = None, compute: torch.dtype | None = None) -> BackendChoice:
    """`auto`: flashinfer when nothing stops it; on a CPU with a float32/float64 pool (`dtype`),
    or a half one below a float32 model (`compute`; None: the pool's dtype), torch-batched; else
    torch. `flashinfer` with a problem raises AttentionBackendUnavailable; an unknown name raises
    ValueError."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(ATTENTION_BACKENDS)}")
    if name == "auto":
        if flashinfer_problem is None:
            return BackendChoice("flashinfer")
        if device_kind == "cpu" and batched_reads(dtype, compute):
            return BackendChoice("torch-batched")
        return BackendChoice("torch", flashinfer_problem if device_kind == "cuda" else None)
    if name == "flashinfer" and flashinfer_problem is not None:
        raise AttentionBackendUnavailable(
            f"flashinfer attention unavailable: {flashinfer_problem}; use --attention-backend torch")
    return BackendChoice(name)


def flashinfer_problem(device: str | torch.device, dtype: torch.dtype | None) -> str | None:
    """Why flashinfer cannot serve a pool of `dtype` (None: not known, assume half) on `device`,
    or None when it can. Imports flashinfer only on an available CUDA device."""
    if torch.device(device).type != "cuda":
        return f"device {device} is not CUDA"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if dtype is not None and dtype not in HALF_DTYPES:
        return f"it computes in float16/bfloat16, not {dtype} (--dtype auto gives bfloat16 on CUDA)"
    try:
        import flashinfer  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "flashinfer":
            return f"importing flashinfer failed: {exc}"
        return "the flashinfer package is not installed (pip install 'pdserve[gpu]')"
    except (ImportError, OSError, RuntimeError) as exc:
        return f"importing flashinfer failed: {exc}"
    return None
