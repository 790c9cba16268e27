"""Attention backends behind one interface: torch (reference, CPU and GPU), flashinfer (CUDA) and
torch-batched (decode attention read from the pool in place; CPU, float32/float64, or a half pool
below a float32 model; auto's choice on a CPU); query (every row alone over its context: the
deterministic mode's, whatever the name asked for)."""

from __future__ import annotations

import logging

import torch

from pdserve.attention.base import AttentionBackend
from pdserve.attention.selection import (
    AttentionBackendUnavailable,
    BackendChoice,
    batched_reads,
    choose_backend,
    flashinfer_problem,
)

log = logging.getLogger(__name__)


def make_attention_backend(
    name: str, device: str | torch.device, dtype: torch.dtype | None = None, deterministic: bool = False,
    compute_dtype: torch.dtype | None = None,
) -> AttentionBackend:
    """`auto` picks flashinfer on a CUDA device with a half-precision pool when flashinfer
    imports, torch-batched on a CPU with a float32/float64 pool (or a half one below a float32
    model), else torch (on CUDA with a warning naming why). `dtype` is the KV pool's dtype (None:
    not known, assume half); `compute_dtype` the model's (None: the pool's). `deterministic`:
    the query backend, whatever `name` (query_backend.py)."""
    if deterministic:
        return _query(device, dtype, compute_dtype)
    problem = flashinfer_problem(device, dtype) if name in ("auto", "flashinfer") else None
    choice = choose_backend(name, torch.device(device).type, problem, dtype, compute_dtype)
    if choice.fallback is not None:
        log.warning("attention backend auto: torch, not flashinfer: %s", choice.fallback)
    return _build(choice, device, dtype, compute_dtype)


def _build(choice: BackendChoice, device: str | torch.device, dtype: torch.dtype | None,
           compute: torch.dtype | None) -> AttentionBackend:
    if choice.name == "torch-batched":
        return _batched(device, dtype, compute)
    if choice.name == "flashinfer":
        from pdserve.attention.flashinfer_backend import FlashInferBackend

        return FlashInferBackend(device)
    from pdserve.attention.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend()


def _batched(device: str | torch.device, dtype: torch.dtype | None, compute: torch.dtype | None) -> AttentionBackend:
    from pdserve.attention.batched_backend import BatchedTorchBackend
    from pdserve.native.paged_decode import load_native_decode

    if torch.device(device).type != "cpu":
        raise AttentionBackendUnavailable(f"torch-batched attention runs on the CPU, not {device}")
    if dtype is not None and not batched_reads(dtype, compute):
        raise AttentionBackendUnavailable(f"torch-batched attention computes in float32/float64 (a half KV pool "
                                          f"below a float32 model), not a {dtype} pool below a {compute} model")
    native = load_native_decode().kernel  # None: the sparse products (the loader says why)
    if native is not None:
        log.info("torch-batched attention: decodes by the C kernel (pdserve/native/paged_decode.c)")
    return BatchedTorchBackend(native)


def _query(device: str | torch.device, dtype: torch.dtype | None, compute: torch.dtype | None) -> AttentionBackend:
    """The query backend on the C kernel (a CPU, a float32 model over a pool the kernel reads),
    flashinfer's decode kernel (CUDA, where its plan fixes the split of each row's keys), else
    the torch loop (slow; the loader or the flashinfer check says why)."""
    from pdserve.attention.query_backend import QueryAttentionBackend
    from pdserve.attention.query_kernels import NativeQueries, TorchQueries

    kind = torch.device(device).type
    if kind == "cpu" and (dtype if compute is None else compute) == torch.float32:
        from pdserve.native.paged_decode import load_native_decode

        native = load_native_decode().kernel
        if native is not None and native.serves(dtype):
            return QueryAttentionBackend(NativeQueries(native))
    if kind == "cuda" and flashinfer_problem(device, dtype) is None:
        from pdserve.attention.flashinfer_queries import FlashInferQueries, deterministic_problem

        if (problem := deterministic_problem()) is None:
            return QueryAttentionBackend(FlashInferQueries(device))
        log.warning("deterministic attention: a torch call per row, not flashinfer: %s", problem)
    log.info("deterministic attention: a torch call per row and layer (slow)")
    return QueryAttentionBackend(TorchQueries())


__all__ = [
    "AttentionBackend",
    "AttentionBackendUnavailable",
    "BackendChoice",
    "make_attention_backend",
    "choose_backend",
]
