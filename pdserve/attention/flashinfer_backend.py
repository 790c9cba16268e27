"""Paged attention on flashinfer's batch prefill kernel (CUDA only; flashinfer imported lazily).

One `BatchPrefillWithPagedKVCacheWrapper` serves the whole mixed batch: a decode token is a
sequence with qo_len 1, a prefill chunk one with qo_len > 1; `causal=True` aligns each
sequence's queries to the end of its KV (bottom-right), which is this project's convention.

The pool's per-layer view `kv.layer(l)` is [num_blocks, 2, block_size, kv_heads, head_dim]
(NHD) and strided in the block dimension (the layers of one block sit between two blocks of
one layer). flashinfer >= 0.2 reads the page, token and head strides from the tensor (it only
requires K and V to share strides, which they do), so the view is passed without a copy.

flashinfer computes in float16/bfloat16 only; a float32 pool is refused at `begin`.
The plan needs the number of query heads, which first shows in `forward`: the wrapper is
planned on the pass's first layer and reused by the others. Each other kind of layer
(LayerAttention: a window, another scale) has a wrapper of its own, planned with `window_left`
(W - 1: the positions before the query it sees) and `sm_scale`, on the same workspace (the
wrappers run one after another on one stream).
A hybrid model's pool (layer groups, pdserve/kv/page_groups.py) has a layout and a wrapper per
(group, kind): each group's layers read their own pages.
NOTE: the windowed plans have not run on a GPU yet; tests/attention checks their arguments only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pdserve.attention.base import AttentionBackend, FULL_ATTENTION, LayerAttention, PlanKey, layer_keys
from pdserve.attention.batch import ForwardBatch
from pdserve.attention.selection import HALF_DTYPES
from pdserve.kv.kv_cache import KVCache

SUPPORTED_DTYPES = HALF_DTYPES
WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class PagedLayout:
    """flashinfer's CSR description of a batch, int32. The indptrs and last-page lengths stay on
    the host (plan reads them there without a device sync); the page ids go to the device."""

    qo_indptr: torch.Tensor  # [S + 1] query rows of sequence i: [qo_indptr[i], qo_indptr[i+1])
    kv_indptr: torch.Tensor  # [S + 1] pages of sequence i: kv_indices[kv_indptr[i]:kv_indptr[i+1]]
    kv_indices: torch.Tensor  # [total pages] block ids
    kv_last_page_len: torch.Tensor  # [S] tokens used in each sequence's last page, 1..block_size
    row_order: torch.Tensor | None  # [rows used] flat rows in sequence order; None: rows 0..T-1 in order


def paged_layout(batch: ForwardBatch, block_size: int, device: torch.device) -> PagedLayout:
    """The batch's sequences as flashinfer's page tables (pure torch: testable without CUDA)."""
    seqs = sorted(batch.seqs, key=lambda s: s.query_start)
    pages = [-(-s.context_len // block_size) for s in seqs]
    indices = [b for s, n in zip(seqs, pages) for b in s.block_table[:n]]
    last = [s.context_len - (n - 1) * block_size for s, n in zip(seqs, pages)]
    starts = [s.query_start for s in seqs]
    lens = [s.query_len for s in seqs]
    in_order = starts == _prefix_sums(lens)[:-1] and sum(lens) == batch.num_tokens
    order = None if in_order else torch.cat([torch.arange(st, st + n) for st, n in zip(starts, lens)])
    return PagedLayout(
        qo_indptr=_int32(_prefix_sums(lens), "cpu"),
        kv_indptr=_int32(_prefix_sums(pages), "cpu"),
        kv_indices=_int32(indices, device),
        kv_last_page_len=_int32(last, "cpu"),
        row_order=None if order is None else order.to(device),
    )


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self, device: str | torch.device):
        self._device = torch.device(device)
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self._device)
        # by layer group and kind of layer; others made on first use
        self._wrappers: dict[PlanKey, Any] = {(0, FULL_ATTENTION): self._new_wrapper()}
        self._batch: ForwardBatch | None = None
        self._layouts: dict[int, PagedLayout] = {}  # by layer group, made on first use
        self._keys: tuple[PlanKey, ...] = ()  # each layer's (group, kind), set by begin
        self._planned: set[PlanKey] = set()

    def begin(self, batch: ForwardBatch, kv: KVCache, layers: Sequence[LayerAttention] = ()) -> None:
        if kv.data.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"flashinfer attention needs a float16/bfloat16 KV pool, got {kv.data.dtype}")
        self._batch, self._layouts = batch, {}
        self._keys = layer_keys(kv, layers)
        self._planned = set()

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: KVCache) -> torch.Tensor:
        assert self._batch is not None, "begin() must be called before forward()"
        key = self._keys[layer]
        view = self._batch.group(key[0])
        kv.write(layer, view.slot_mapping, k, v)
        if key[0] not in self._layouts:
            self._layouts[key[0]] = paged_layout(view, kv.block_size, kv.data.device)
        layout = self._layouts[key[0]]
        if key not in self._planned:
            self._plan(key, layout, q, kv)
        queries = q if layout.row_order is None else q[layout.row_order]
        out = self._wrappers[key].run(queries.contiguous(), kv.layer(layer))  # [T, H, D]
        if layout.row_order is None:
            return out
        return out.new_zeros((q.shape[0], *out.shape[1:])).index_copy_(0, layout.row_order, out)

    def _new_wrapper(self) -> Any:
        import flashinfer

        return flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, kv_layout="NHD")

    def _plan(self, key: PlanKey, layout: PagedLayout, q: torch.Tensor, kv: KVCache) -> None:
        if key not in self._wrappers:
            self._wrappers[key] = self._new_wrapper()
        self._wrappers[key].plan(
            layout.qo_indptr,
            layout.kv_indptr,
            layout.kv_indices,
            layout.kv_last_page_len,
            num_qo_heads=q.shape[1],
            num_kv_heads=kv.shape.num_kv_heads,
            head_dim_qk=kv.shape.head_dim,
            page_size=kv.block_size,
            causal=True,
            q_data_type=q.dtype,
            kv_data_type=kv.data.dtype,
            **_kind_options(key[1]),
        )
        self._planned.add(key)


def _kind_options(kind: LayerAttention) -> dict[str, Any]:
    """plan()'s options for a kind of layer (none for FULL_ATTENTION: flashinfer's defaults)."""
    options: dict[str, Any] = {}
    if kind.window is not None:
        options["window_left"] = kind.window - 1
    if kind.scale is not None:
        options["sm_scale"] = kind.scale
    return options


def _prefix_sums(values: list[int]) -> list[int]:
    sums = [0]
    for value in values:
        sums.append(sums[-1] + value)
    return sums


def _int32(values: list[int], device: torch.device | str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)
