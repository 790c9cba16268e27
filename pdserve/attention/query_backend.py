"""Attention whose every output row is a function of that row's query and context alone: the
deterministic mode's backend (`--deterministic`; `query`).

Every row of the flat batch, a decode token or any row of a prefill chunk, is attended as a
one-token sequence over the positions it sees, read from the pool after the pass's keys and
values were written there:

    seq (query_start s, query_len Q, context_len C)  ->  rows s + j, j < Q:
        one query at position p = C - Q + j over positions [start(p), p], start(p) = 0 or p - W + 1

A row's reduction order (its scores, softmax and weighted sum of values) is then fixed by its
position, its window and the block size, whatever else the pass holds, however the prompt was
chunked and whether the row is a prefill's or a decode's, so the KV a prefill writes for a
position equals what decoding that position writes. The QueryKernel computes the rows
(query_kernels.py: the C kernel of pdserve/native/paged_decode.c, or a torch loop, one call per
row; flashinfer_queries.py on a GPU).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from pdserve.attention.base import AttentionBackend, FULL_ATTENTION, LayerAttention, PlanKey, layer_keys, plan_keys
from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.kv.kv_cache import KVCache

if TYPE_CHECKING:
    from pdserve.native.paged_decode import NativeDecode, NativePlan


def query_rows(batch: ForwardBatch) -> tuple[SeqSpan, ...]:
    """Each row of the flat batch as a one-token sequence (query_start = its row), in row order.
    Raises ValueError where the sequences do not cover rows 0..T-1 once each."""
    rows = sorted((s.query_start + j, SeqSpan(s.query_start + j, 1, s.context_len - s.query_len + j + 1,
                                              s.block_table))
                  for s in batch.seqs for j in range(s.query_len))
    if [row for row, _ in rows] != list(range(batch.num_tokens)):
        raise ValueError("the batch's sequences do not cover each of its rows once")
    return tuple(span for _, span in rows)


def window_start(span: SeqSpan, window: int | None) -> int:
    """The first position a one-token sequence's query sees."""
    return 0 if window is None else max(0, span.context_len - window)


class QueryKernel(ABC):
    """Computes one-token sequences over the pool. NOTE: a row's output must be a function of its
    query, the keys and values of the positions it sees, its start and length, and the pool's
    block size only: never of the other rows, their number or the thread count."""

    name: str

    @abstractmethod
    def plan(self, rows: Sequence[SeqSpan], kv: KVCache, key: PlanKey, slot_mapping: torch.Tensor) -> Any:
        """The rows' plan for the layers of `key` (their group, and kind: window, scale) whose new
        keys and values go to `slot_mapping`, valid for every such layer of the pass."""

    @abstractmethod
    def attend(self, q: torch.Tensor, kv: KVCache, layer: int, plan: Any) -> torch.Tensor:
        """q: [T, H, D], one row per planned sequence -> [T, H, D]."""

    @abstractmethod
    def write(self, kv: KVCache, layer: int, plan: Any, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [T, Hkv, D] into the pool at the plan's slots."""

    def native_pass(self, plan: Any) -> tuple[NativeDecode, NativePlan] | None:
        """The C decode kernel and its plan where this kernel is that one and writes the keys and
        values itself (a fused decode step then calls it directly: the same rows, the same
        bits), else None."""
        return None


@dataclass(frozen=True)
class _Pass:
    plans: dict[PlanKey, Any]
    decodes_only: bool  # every sequence one token


class QueryAttentionBackend(AttentionBackend):
    name = "query"

    def __init__(self, kernel: QueryKernel):
        self.kernel = kernel
        self._pass: _Pass | None = None
        self._keys: tuple[PlanKey, ...] = ()  # each layer's (group, kind), set by begin

    def begin(self, batch: ForwardBatch, kv: KVCache, layers: Sequence[LayerAttention] = ()) -> None:
        self._keys = layer_keys(kv, layers)
        keys = plan_keys(self._keys)
        views = {g: batch.group(g) for g in dict.fromkeys(g for g, _ in keys)}
        rows = {g: query_rows(view) for g, view in views.items()}
        plans = {key: self.kernel.plan(rows[key[0]], kv, key, views[key[0]].slot_mapping) for key in keys}
        self._pass = _Pass(plans, all(s.query_len == 1 for s in batch.seqs))

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: KVCache) -> torch.Tensor:
        step = self._pass
        assert step is not None, "begin() must be called before forward()"
        plan = step.plans[self._keys[layer]]
        self.kernel.write(kv, layer, plan, k, v)
        return self.kernel.attend(q, kv, layer, plan)

    def native_decode_pass(self) -> tuple[NativeDecode, NativePlan] | None:
        step = self._pass
        if step is None or not step.decodes_only or tuple(step.plans) != ((0, FULL_ATTENTION),):
            return None
        return self.kernel.native_pass(step.plans[(0, FULL_ATTENTION)])
