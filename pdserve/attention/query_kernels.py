"""The query backend's kernels on a CPU (query_backend.py says what they compute):

    native: every row in one call of the C kernel (pdserve/native/paged_decode.c,
            `pdserve_paged_attend_from`): a row is one thread's, its positions taken in segments
            that end at position + 16, its block's end or its length, then one softmax and one
            pass over the values (float32 queries; float32 pools, or half ones widened as read);
            keys and values copied in by its library (rounded into a half pool)
    torch:  a loop, one reference decode call per row (torch_backend.attend_decode): its keys
            gathered to whole blocks, the positions it does not see masked; every tensor's shape
            a function of the row's length alone, so the same row computes the same way in any
            pass (any dtype, any device; slow: a call per row and layer)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pdserve.attention.base import PlanKey
from pdserve.attention.batch import SeqSpan
from pdserve.attention.pool_rows import block_tables
from pdserve.attention.query_backend import QueryKernel, window_start
from pdserve.attention.torch_backend import DecodeGroup, attend_decode, plan_decode
from pdserve.kv.kv_cache import KVCache
from pdserve.native.paged_decode import NativeDecode, NativePlan


@dataclass(frozen=True)
class NativeRows:
    plan: NativePlan
    scale: float | None
    slot_mapping: torch.Tensor
    native_writes: bool  # the kernel's library copies the keys and values (slots checked)
    full: bool  # every row from position 0 at the default scale: what a fused decode step attends


class NativeQueries(QueryKernel):
    name = "native"

    def __init__(self, native: NativeDecode):
        self.native = native

    def plan(self, rows: Sequence[SeqSpan], kv: KVCache, key: PlanKey, slot_mapping: torch.Tensor) -> NativeRows:
        kind, lens = key[1], [s.context_len for s in rows]
        starts = None if kind.window is None else [window_start(s, kind.window) for s in rows]
        plan = self.native.plan(block_tables(list(rows), kv.block_size, max(lens)), lens, kv.data, starts)
        writes = self.native.slots_problem(slot_mapping, kv.data) is None  # else kv.write says what is wrong
        return NativeRows(plan, kind.scale, slot_mapping, writes, starts is None and kind.scale is None)

    def write(self, kv: KVCache, layer: int, plan: NativeRows, k: torch.Tensor, v: torch.Tensor) -> None:
        if plan.native_writes:
            self.native.write(kv.data, kv.slot(layer), plan.slot_mapping, k, v)
        else:
            kv.write(layer, plan.slot_mapping, k, v)

    def attend(self, q: torch.Tensor, kv: KVCache, layer: int, plan: NativeRows) -> torch.Tensor:
        return self.native.attend(q, kv.data, kv.slot(layer), plan.plan, plan.scale)

    def native_pass(self, plan: NativeRows) -> tuple[NativeDecode, NativePlan] | None:
        return (self.native, plan.plan) if plan.full and plan.native_writes else None


@dataclass(frozen=True)
class TorchRows:
    groups: tuple[DecodeGroup, ...]  # one a row, in row order
    slot_mapping: torch.Tensor


class TorchQueries(QueryKernel):
    name = "torch"

    def plan(self, rows: Sequence[SeqSpan], kv: KVCache, key: PlanKey, slot_mapping: torch.Tensor) -> TorchRows:
        device, dtype, size = kv.data.device, kv.data.dtype, kv.block_size
        return TorchRows(tuple(plan_decode([s], size, device, dtype, key[1]) for s in rows), slot_mapping)

    def write(self, kv: KVCache, layer: int, plan: TorchRows, k: torch.Tensor, v: torch.Tensor) -> None:
        kv.write(layer, plan.slot_mapping, k, v)

    def attend(self, q: torch.Tensor, kv: KVCache, layer: int, plan: TorchRows) -> torch.Tensor:
        cache = kv.layer(layer)
        out = torch.empty_like(q)
        for group in plan.groups:
            out[group.rows] = attend_decode(q, cache, group)
        return out
