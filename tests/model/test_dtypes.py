"""The serving dtype by device, with the device's facts given (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from pdserve.config import DTYPE_NAMES
from pdserve.model.dtypes import DeviceFacts, resolve_dtype, serving_dtype

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
