"""The query backend's kernel on a GPU: flashinfer's batch decode kernel with every row of the
pass as its own one-token sequence (query_backend.py), planned with the split of each row's keys
turned off (`disable_split_kv`), so one thread block reduces a row's keys in page order whatever
the batch holds. Its kernel configuration depends on the head size, the query heads per KV head,
the page size and the dtypes only, never on the rows.

    row at position p:  pages = its table's first ceil((p + 1) / page_size), last page p % page_size + 1
                        window_left = W - 1 for a layer with a window; sm_scale where it has one

NOTE: written, not yet run on a GPU (no device was lent when it was): the CPU tests check the
page tables it builds only. flashinfer releases whose decode plan() lacks `disable_split_kv`
are refused (`deterministic_problem`): the torch loop runs instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pdserve.attention.base import LayerAttention, PlanKey
from pdserve.attention.batch import SeqSpan
from pdserve.attention.flashinfer_backend import WORKSPACE_BYTES
from pdserve.attention.query_backend import QueryKernel
from pdserve.kv.kv_cache import KVCache

DETERMINISTIC_OPTION = "disable_split_kv"


@dataclass(frozen=True)
class RowPages:
    """flashinfer's decode page tables of the rows, int32 (indptr and last lengths on the host)."""

    indptr: torch.Tensor  # [T + 1]
    indices: torch.Tensor  # [pages of every row], on the device
    last_page_len: torch.Tensor  # [T]


def row_pages(rows: Sequence[SeqSpan], page_size: int, device: torch.device | str) -> RowPages:
    """Each one-token sequence's pages (pure torch: testable without CUDA)."""
    counts = [-(-s.context_len // page_size) for s in rows]
    indptr = [0]
    for count in counts:
        indptr.append(indptr[-1] + count)
    indices = [b for s, n in zip(rows, counts) for b in s.block_table[:n]]
    last = [s.context_len - (n - 1) * page_size for s, n in zip(rows, counts)]
    return RowPages(_int32(indptr, "cpu"), _int32(indices, device), _int32(last, "cpu"))


def _int32(values: list[int], device: torch.device | str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def deterministic_problem() -> str | None:
    """Why the installed flashinfer cannot fix each row's reduction (None: it can)."""
    import flashinfer

    plan = flashinfer.BatchDecodeWithPagedKVCacheWrapper.plan
    if DETERMINISTIC_OPTION not in inspect.signature(plan).parameters:
        return f"its decode plan() has no {DETERMINISTIC_OPTION} (flashinfer {flashinfer.__version__})"
    return None


@dataclass
class FlashInferRows:
    wrapper: Any
    pages: RowPages
    kind: LayerAttention
    slot_mapping: torch.Tensor
    planned: bool = False  # planned on the first layer that runs it (the head count shows there)


class FlashInferQueries(QueryKernel):
    name = "flashinfer"

    def __init__(self, device: str | torch.device):
        self._device = torch.device(device)
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self._device)
        self._wrappers: dict[PlanKey, Any] = {}  # one a (layer group, kind), on the shared workspace

    def plan(self, rows: Sequence[SeqSpan], kv: KVCache, key: PlanKey, slot_mapping: torch.Tensor) -> FlashInferRows:
        if key not in self._wrappers:
            import flashinfer

            self._wrappers[key] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._workspace, kv_layout="NHD")
        return FlashInferRows(self._wrappers[key], row_pages(rows, kv.block_size, kv.data.device), key[1],
                              slot_mapping)

    def write(self, kv: KVCache, layer: int, plan: FlashInferRows, k: torch.Tensor, v: torch.Tensor) -> None:
        kv.write(layer, plan.slot_mapping, k, v)

    def attend(self, q: torch.Tensor, kv: KVCache, layer: int, plan: FlashInferRows) -> torch.Tensor:
        if not plan.planned:
            _plan(plan, q, kv)
        return plan.wrapper.run(q.contiguous(), kv.layer(layer))  # [T, H, D]


def _plan(plan: FlashInferRows, q: torch.Tensor, kv: KVCache) -> None:
    options: dict[str, Any] = {DETERMINISTIC_OPTION: True}
    if plan.kind.window is not None:
        options["window_left"] = plan.kind.window - 1
    if plan.kind.scale is not None:
        options["sm_scale"] = plan.kind.scale
    pages = plan.pages
    plan.wrapper.plan(pages.indptr, pages.indices, pages.last_page_len, q.shape[1], kv.shape.num_kv_heads,
                      kv.shape.head_dim, kv.block_size, q_data_type=q.dtype, kv_data_type=kv.data.dtype, **options)
    plan.planned = True
