"""Attention backends behind one interface: torch (reference, CPU and GPU), flashinfer (CUDA) and
torch-batched (decode attention read from the pool in place; CPU, float32)."""

from __future__ import annotations

import importlib.util

import torch

from pdserve.attention.base import AttentionBackend

BACKEND_NAMES = ("auto", "torch", "flashinfer", "torch-batched")


class AttentionBackendUnavailable(RuntimeError):
    """The named backend cannot run here (no CUDA, flashinfer not installed, unsupported dtype)."""


def make_attention_backend(
    name: str, device: str | torch.device, dtype: torch.dtype | None = None
) -> AttentionBackend:
    """`auto` picks flashinfer on a CUDA device with a half-precision pool when flashinfer is
    installed, else torch. `dtype` is the KV pool's dtype (None: not known, assume half)."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    if name == "torch-batched":
        return _batched(device, dtype)
    if name == "torch" or (name == "auto" and _flashinfer_problem(device, dtype) is not None):
        from pdserve.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    problem = _flashinfer_problem(device, dtype)
    if problem is not None:
        raise AttentionBackendUnavailable(f"flashinfer attention unavailable: {problem}; use --attention-backend torch")
    from pdserve.attention.flashinfer_backend import FlashInferBackend

    return FlashInferBackend(device)


def _batched(device: str | torch.device, dtype: torch.dtype | None) -> AttentionBackend:
    from pdserve.attention.batched_backend import BatchedTorchBackend
    from pdserve.attention.pool_rows import SUPPORTED_DTYPES

    if torch.device(device).type != "cpu":
        raise AttentionBackendUnavailable(f"torch-batched attention runs on the CPU, not {device}")
    if dtype is not None and dtype not in SUPPORTED_DTYPES:
        raise AttentionBackendUnavailable(f"torch-batched attention computes in float32/float64, not {dtype}")
    return BatchedTorchBackend()


def _flashinfer_problem(device: str | torch.device, dtype: torch.dtype | None) -> str | None:
    if torch.device(device).type != "cuda":
        return f"device {device} is not CUDA"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
        return f"it computes in float16/bfloat16, not {dtype}"
    if importlib.util.find_spec("flashinfer") is None:
        return "the flashinfer package is not installed (pip install 'pdserve[gpu]')"
    try:
        import flashinfer  # noqa: F401
    except (ImportError, OSError, RuntimeError) as exc:
        return f"importing flashinfer failed: {exc}"
    return None


__all__ = ["AttentionBackend", "AttentionBackendUnavailable", "make_attention_backend", "BACKEND_NAMES"]
