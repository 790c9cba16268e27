"""The serving dtype by device, and the KV cache's below it, with the device's facts given (no GPU
needed)."""

from __future__ import annotations

import pytest
import torch

from pdserve.config import DTYPE_NAMES
from pdserve.model.dtypes import DeviceFacts, resolve_dtype, resolve_kv_dtype, serving_dtype

CPU = DeviceFacts("cpu")
AMPERE = DeviceFacts("cuda", bf16_supported=True)
TURING = DeviceFacts("cuda", bf16_supported=False)


@pytest.mark.parametrize(("facts", "expected"), [(CPU, torch.float32), (AMPERE, torch.bfloat16),
                                                 (TURING, torch.float16), (DeviceFacts("mps"), torch.float32)])
def test_auto_is_bf16_on_cuda_fp16_without_bf16_and_fp32_elsewhere(facts, expected):
    assert resolve_dtype("auto", facts) == expected


@pytest.mark.parametrize("facts", [CPU, AMPERE, TURING])
def test_a_named_dtype_is_taken_as_given(facts):
    named = [name for name in DTYPE_NAMES if name != "auto"]
    assert [resolve_dtype(name, facts) for name in named] == [torch.float32, torch.bfloat16, torch.float16]


def test_an_unknown_name_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="unknown dtype 'half'; choose one of auto, float32, bfloat16, float16"):
        resolve_dtype("half", CPU)


def test_probing_the_cpu_asks_nothing_of_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: pytest.fail("CUDA was queried"))
    assert DeviceFacts.probe("cpu") == CPU
    assert serving_dtype("auto", torch.device("cpu")) == torch.float32


@pytest.mark.parametrize("supported", [True, False])
def test_probing_a_cuda_device_reads_bf16_support(monkeypatch, supported):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: supported)
    assert DeviceFacts.probe("cuda:0") == DeviceFacts("cuda", bf16_supported=supported)
    assert serving_dtype("auto", "cuda") == (torch.bfloat16 if supported else torch.float16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback without CUDA")
def test_a_cuda_device_without_cuda_reports_no_bf16():
    assert DeviceFacts.probe("cuda") == TURING



@pytest.mark.parametrize("serving", [torch.float32, torch.bfloat16, torch.float16])
def test_the_kv_cache_holds_the_models_dtype_by_default(serving):
    assert resolve_kv_dtype("auto", serving, CPU) == serving and resolve_kv_dtype("auto", serving, AMPERE) == serving


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_a_half_kv_cache_below_a_float32_model_on_a_cpu(name):
    assert resolve_kv_dtype(name, torch.float32, CPU) == getattr(torch, name)


@pytest.mark.parametrize(("name", "serving", "facts"), [
    ("bfloat16", torch.float32, AMPERE),  # flashinfer reads the queries' dtype
    ("float16", torch.bfloat16, AMPERE),
    ("float32", torch.bfloat16, CPU),  # a wider cache than the model: nothing reads it
    ("float16", torch.bfloat16, CPU),
])
def test_any_other_kv_cache_is_refused_saying_what_is_served(name, serving, facts):
    with pytest.raises(ValueError, match="bfloat16 or float16 below a float32 model on a CPU"):
        resolve_kv_dtype(name, serving, facts)


def test_an_unknown_kv_cache_dtype_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="auto, float32, bfloat16, float16"):
        resolve_kv_dtype("fp8", torch.float32, CPU)
