"""The backend choice from the name and what stops flashinfer, and the warning auto gives on CUDA
when it falls back to torch (all on CPU: the device facts are given or patched)."""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch

from pdserve.attention import make_attention_backend
from pdserve.attention.selection import (
    AttentionBackendUnavailable,
    BackendChoice,
    choose_backend,
    flashinfer_problem,
)
from pdserve.attention.batched_backend import BatchedTorchBackend
from pdserve.attention.torch_backend import TorchAttentionBackend

NOT_INSTALLED = "the flashinfer package is not installed (pip install 'pdserve[gpu]')"


def test_auto_takes_flashinfer_when_nothing_stops_it():
    assert choose_backend("auto", "cuda", None) == BackendChoice("flashinfer")


def test_auto_on_cuda_falls_back_to_torch_naming_why():
    assert choose_backend("auto", "cuda", NOT_INSTALLED) == BackendChoice("torch", fallback=NOT_INSTALLED)


def test_auto_on_the_cpu_is_torch_batched_for_full_precision_and_torch_otherwise():
    assert choose_backend("auto", "cpu", "device cpu is not CUDA", torch.float32) == BackendChoice("torch-batched")
    assert choose_backend("auto", "cpu", "device cpu is not CUDA", torch.float64) == BackendChoice("torch-batched")
    assert choose_backend("auto", "cpu", "device cpu is not CUDA", torch.bfloat16) == BackendChoice("torch")
    assert choose_backend("auto", "cpu", "device cpu is not CUDA") == BackendChoice("torch")


@pytest.mark.parametrize("pool", [torch.bfloat16, torch.float16])
def test_auto_on_the_cpu_is_torch_batched_for_a_half_pool_below_a_float32_model_only(pool):
    cpu = "device cpu is not CUDA"
    assert choose_backend("auto", "cpu", cpu, pool, torch.float32) == BackendChoice("torch-batched")
    assert choose_backend("auto", "cpu", cpu, pool, pool) == BackendChoice("torch")  # a half model: the reference
    assert isinstance(make_attention_backend("auto", "cpu", pool, compute_dtype=torch.float32), BatchedTorchBackend)
    with pytest.raises(AttentionBackendUnavailable, match="a half KV pool below a float32 model"):
        make_attention_backend("torch-batched", "cpu", pool, compute_dtype=pool)


@pytest.mark.parametrize("name", ["torch", "torch-batched"])
def test_a_named_backend_is_taken_as_given(name):
    assert choose_backend(name, "cuda", None) == BackendChoice(name)


def test_flashinfer_asked_for_but_stopped_is_an_error_with_the_reason():
    with pytest.raises(AttentionBackendUnavailable, match="unavailable: CUDA is not available; use --attention"):
        choose_backend("flashinfer", "cuda", "CUDA is not available")


@pytest.fixture
def cuda_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_a_float32_pool_on_cuda_is_a_problem_that_names_the_dtype(cuda_present):
    assert "not torch.float32" in flashinfer_problem("cuda", torch.float32)


def test_flashinfer_missing_is_named(cuda_present, monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import raises ModuleNotFoundError
    assert flashinfer_problem("cuda", torch.bfloat16) == NOT_INSTALLED


def test_flashinfer_that_imports_is_no_problem(cuda_present, monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    assert flashinfer_problem("cuda", torch.bfloat16) is None
    assert flashinfer_problem("cuda", None) is None


def test_auto_on_cuda_without_flashinfer_warns_and_gives_torch(cuda_present, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with caplog.at_level(logging.WARNING, logger="pdserve.attention"):
        backend = make_attention_backend("auto", "cuda", torch.bfloat16)
    assert isinstance(backend, TorchAttentionBackend)
    assert [r.getMessage() for r in caplog.records] == [f"attention backend auto: torch, not flashinfer: {NOT_INSTALLED}"]


def test_auto_on_the_cpu_warns_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="pdserve.attention"):
        assert isinstance(make_attention_backend("auto", "cpu", torch.float32), BatchedTorchBackend)
        assert isinstance(make_attention_backend("auto", "cpu", torch.bfloat16), TorchAttentionBackend)
    assert caplog.records == []
