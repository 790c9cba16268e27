"""Choosing a backend by name, and flashinfer's page tables (computed without CUDA)."""

from __future__ import annotations

import sys

import pytest
import torch

from pdserve.attention import AttentionBackendUnavailable, make_attention_backend
from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.attention.flashinfer_backend import paged_layout
from pdserve.attention.torch_backend import TorchAttentionBackend
from tests.attention.naive import naive_attention


def test_torch_and_auto_on_cpu_give_the_torch_backend():
    assert isinstance(make_attention_backend("torch", "cpu"), TorchAttentionBackend)
    assert isinstance(make_attention_backend("auto", "cpu"), TorchAttentionBackend)
    assert isinstance(make_attention_backend("auto", "cuda", torch.float32), TorchAttentionBackend)


def test_flashinfer_without_cuda_is_a_clear_error():
    with pytest.raises(AttentionBackendUnavailable, match="flashinfer attention unavailable: device cpu is not CUDA"):
        make_attention_backend("flashinfer", "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_flashinfer_on_a_cuda_device_without_cuda_names_the_reason():
    with pytest.raises(AttentionBackendUnavailable, match="CUDA is not available"):
        make_attention_backend("flashinfer", "cuda")


def test_unknown_backend_name_is_rejected():
    with pytest.raises(ValueError, match="unknown attention backend 'flash'.*auto, torch, flashinfer"):
        make_attention_backend("flash", "cpu")


def batch_of(spans: list[SeqSpan], tokens: int) -> ForwardBatch:
    zeros = torch.zeros(tokens, dtype=torch.long)
    return ForwardBatch(zeros, zeros, zeros, tuple(spans), torch.zeros(0, dtype=torch.long))


def test_paged_layout_describes_each_sequence_in_csr_form():
    spans = [
        SeqSpan(query_start=0, query_len=5, context_len=5, block_table=(7, 2)),  # fresh prompt
        SeqSpan(query_start=5, query_len=1, context_len=9, block_table=(4, 0, 3, 9)),  # decode, last page 1
        SeqSpan(query_start=6, query_len=3, context_len=8, block_table=(1, 5)),  # chunk, full last page
    ]
    layout = paged_layout(batch_of(spans, 9), block_size=4, device=torch.device("cpu"))
    assert layout.qo_indptr.tolist() == [0, 5, 6, 9]
    assert layout.kv_indptr.tolist() == [0, 2, 5, 7]
    assert layout.kv_indices.tolist() == [7, 2, 4, 0, 3, 1, 5]
    assert layout.kv_last_page_len.tolist() == [1, 1, 4]
    assert layout.qo_indptr.dtype == torch.int32 and layout.kv_indices.dtype == torch.int32
    assert layout.row_order is None


def test_paged_layout_sorts_sequences_by_their_rows():
    spans = [SeqSpan(3, 1, 2, (6,)), SeqSpan(0, 3, 3, (1,))]
    layout = paged_layout(batch_of(spans, 4), block_size=4, device=torch.device("cpu"))
    assert layout.qo_indptr.tolist() == [0, 3, 4]
    assert layout.kv_indices.tolist() == [1, 6]
    assert layout.row_order is None


def test_paged_layout_gathers_rows_when_the_batch_has_gaps():
    spans = [SeqSpan(0, 2, 2, (3,)), SeqSpan(3, 1, 5, (0, 1))]  # row 2 belongs to no sequence
    layout = paged_layout(batch_of(spans, 4), block_size=4, device=torch.device("cpu"))
    assert layout.qo_indptr.tolist() == [0, 2, 3]
    assert layout.row_order.tolist() == [0, 1, 3]


@pytest.fixture
def fake_flashinfer(monkeypatch):
    from tests.attention.fake_flashinfer import FakeBatchPrefillWithPagedKVCacheWrapper, FakeFlashInferModule

    FakeBatchPrefillWithPagedKVCacheWrapper.instances.clear()
    monkeypatch.setitem(sys.modules, "flashinfer", FakeFlashInferModule())
    return FakeBatchPrefillWithPagedKVCacheWrapper.instances


@pytest.mark.parametrize("shuffle", [False, True])
def test_flashinfer_backend_wiring_against_a_documented_stand_in(fake_flashinfer, shuffle):
    """The backend plans once per pass, passes the strided per-layer pool view, and returns rows
    in batch order: checked on CPU against dense attention through a fake of flashinfer's API."""
    from pdserve.attention.flashinfer_backend import FlashInferBackend
    from tests.attention.test_attention_torch import LAYERS, Case, build, new_kv, new_rows

    cases = [Case(0, 7), Case(9, 1), Case(20, 6), Case(3, 1)]
    kv, batch, q, keys, values = build(cases, 6, 2, 16, 4, seed=2, shuffle=shuffle)
    kv.data = kv.data.to(torch.bfloat16)
    backend = FlashInferBackend("cpu")
    backend.begin(batch, kv)
    for layer in range(LAYERS):
        k, v = new_kv(batch, cases, keys, values, layer)
        out = backend.forward(layer, q[layer].bfloat16(), k.bfloat16(), v.bfloat16(), kv)
        for i, case in enumerate(cases):
            expected = naive_attention(q[layer][new_rows(batch, i)], keys[i][layer], values[i][layer], case.cached)
            torch.testing.assert_close(out[new_rows(batch, i)].double(), expected, rtol=0.05, atol=0.05)
    (wrapper,) = fake_flashinfer
    assert len(wrapper.plans) == 1 and wrapper.runs == LAYERS
    plan = wrapper.plans[0]
    assert plan["causal"] and (plan["heads"], plan["kv_heads"], plan["page_size"]) == (6, 2, 4)
    assert plan["q_dtype"] == torch.bfloat16
