"""The attention interface the model calls once per layer.

A backend turns one ForwardBatch into a plan (`begin`), then for every layer writes the new K/V
into the paged pool and attends each sequence's queries over its cached context (`forward`):

    seq i, query j (0 <= j < query_len) sits at position p = context_len - query_len + j
    and attends KV positions [0, p] of its own sequence (causal), read through its block_table.

Grouped-query attention: query head h reads KV head h // (num_heads // num_kv_heads).

A layer may narrow that (its LayerAttention, passed to `begin` per layer): with a window W the
query at p attends positions [max(0, p - W + 1), p] only (at most W, itself included), and the
scores may be scaled by another factor than 1 / sqrt(head_dim):

    positions     0  1  2  3  4  5  6  7
    p = 6, W = 4              [3  4  5  6]
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pdserve.attention.batch import ForwardBatch
from pdserve.kv.kv_cache import KVCache

if TYPE_CHECKING:
    from pdserve.native.paged_decode import NativeDecode, NativePlan


@dataclass(frozen=True)
class LayerAttention:
    """What one layer's attention computes beyond the causal grouped-query form above."""

    window: int | None = None  # positions each query sees, itself included; None: every earlier one
    scale: float | None = None  # scores are q.k times this; None: 1 / sqrt(head_dim)


FULL_ATTENTION = LayerAttention()


def attention_kinds(layers: Sequence[LayerAttention]) -> tuple[LayerAttention, ...]:
    """The distinct kinds among a pass's layers (each planned once), in first-use order."""
    return tuple(dict.fromkeys(layers)) or (FULL_ATTENTION,)


def layer_kind(layers: Sequence[LayerAttention], layer: int) -> LayerAttention:
    """`layer`'s kind: layers[layer], or FULL_ATTENTION where `layers` is empty."""
    return layers[layer] if layers else FULL_ATTENTION


PlanKey = tuple[int, LayerAttention]  # a layer group of the pool, a kind of attention


def layer_keys(kv: KVCache, layers: Sequence[LayerAttention]) -> tuple[PlanKey, ...]:
    """Each layer's (layer group, kind): found once a pass, so `forward` only indexes it."""
    return tuple(plan_key(kv, layers, layer) for layer in range(len(kv.groups.layer_group)))


def plan_keys(keys: Sequence[PlanKey]) -> tuple[PlanKey, ...]:
    """What a pass plans once each: the distinct (layer group, kind) of its layers' `keys`
    (layer_keys), in first-use order."""
    return tuple(dict.fromkeys(keys))


def plan_key(kv: KVCache, layers: Sequence[LayerAttention], layer: int) -> PlanKey:
    return kv.groups.layer_group[layer], layer_kind(layers, layer)


class AttentionBackend(ABC):
    name: str

    @abstractmethod
    def begin(self, batch: ForwardBatch, kv: KVCache, layers: Sequence[LayerAttention] = ()) -> None:
        """Plan one forward pass: gather indices, masks, kernel metadata. Called once per pass,
        before the first layer; the plan is valid until the next `begin`. `layers[l]`: layer l's
        attention (empty: every layer FULL_ATTENTION); a backend that cannot compute a kind
        raises ValueError naming it."""

    @abstractmethod
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: KVCache) -> torch.Tensor:
        """q: [T, num_heads, head_dim]; k, v: [T, num_kv_heads, head_dim] for the batch's tokens.

        Mutates `kv`: writes k, v at the batch's slot_mapping in `layer` (KVCache.write).
        Returns the attention output [T, num_heads, head_dim], rows in batch order."""

    def native_decode_pass(self) -> tuple[NativeDecode, NativePlan] | None:
        """The C kernel and its plan when every token of the planned pass is a decode that kernel
        attends and writes into the pool (a fused decode step may then call it directly), else
        None. Called after `begin`."""
        return None
