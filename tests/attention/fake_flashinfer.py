"""A stand-in for flashinfer's BatchPrefillWithPagedKVCacheWrapper, computing on CPU exactly what
its documentation promises, so the backend's wiring (plan arguments, page tables, cache layout,
row order) is checked without CUDA. It asserts the documented argument types and shapes."""

from __future__ import annotations

import math

import torch


class FakeBatchPrefillWithPagedKVCacheWrapper:
    instances: list["FakeBatchPrefillWithPagedKVCacheWrapper"] = []

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD"):
        assert float_workspace_buffer.dtype == torch.uint8
        assert kv_layout == "NHD"
        self.plans: list[dict] = []
        self.runs = 0
        FakeBatchPrefillWithPagedKVCacheWrapper.instances.append(self)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, *, causal=False, q_data_type=torch.float16,
             kv_data_type=None, **unused):
        for t in (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len):
            assert t.dtype == torch.int32 and t.dim() == 1
        assert len(qo_indptr) == len(paged_kv_indptr) == len(paged_kv_last_page_len) + 1
        assert num_qo_heads % num_kv_heads == 0
        self.plans.append(dict(qo=qo_indptr.tolist(), kv=paged_kv_indptr.tolist(), pages=paged_kv_indices.tolist(),
                               last=paged_kv_last_page_len.tolist(), heads=num_qo_heads, kv_heads=num_kv_heads,
                               head_dim=head_dim_qk, page_size=page_size, causal=causal, q_dtype=q_data_type))

    def run(self, q: torch.Tensor, paged_kv_cache: torch.Tensor) -> torch.Tensor:
        plan = self.plans[-1]
        assert q.is_contiguous() and q.shape[1:] == (plan["heads"], plan["head_dim"])
        assert paged_kv_cache.shape[1:] == (2, plan["page_size"], plan["kv_heads"], plan["head_dim"])
        assert paged_kv_cache.stride(-1) == 1
        self.runs += 1
        out = torch.empty_like(q)
        for i in range(len(plan["qo"]) - 1):
            rows = slice(plan["qo"][i], plan["qo"][i + 1])
            pages = plan["pages"][plan["kv"][i] : plan["kv"][i + 1]]
            kv_len = (len(pages) - 1) * plan["page_size"] + plan["last"][i]
            seq_kv = paged_kv_cache[pages].transpose(0, 1).reshape(2, -1, plan["kv_heads"], plan["head_dim"])
            out[rows] = _attend(q[rows], seq_kv[0, :kv_len], seq_kv[1, :kv_len], plan["causal"])
        return out


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Bottom-right causal: query i of Q sees keys [0, kv_len - Q + i]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)  # [C, H, D]
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) / math.sqrt(q.shape[-1])
    if causal:
        offset = k.shape[0] - q.shape[0]
        visible = torch.arange(k.shape[0])[None, :] <= torch.arange(q.shape[0])[:, None] + offset
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(q.dtype)


class FakeFlashInferModule:
    BatchPrefillWithPagedKVCacheWrapper = FakeBatchPrefillWithPagedKVCacheWrapper
