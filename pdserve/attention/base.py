"""The attention interface the model calls once per layer.

A backend turns one ForwardBatch into a plan (`begin`), then for every layer writes the new K/V
into the paged pool and attends each sequence's queries over its cached context (`forward`):

    seq i, query j (0 <= j < query_len) sits at position p = context_len - query_len + j
    and attends KV positions [0, p] of its own sequence (causal), read through its block_table.

Grouped-query attention: query head h reads KV head h // (num_heads // num_kv_heads).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

from pdserve.attention.batch import ForwardBatch
from pdserve.kv.kv_cache import KVCache

if TYPE_CHECKING:
    from pdserve.native.paged_decode import NativeDecode, NativePlan


class AttentionBackend(ABC):
    name: str

    @abstractmethod
    def begin(self, batch: ForwardBatch, kv: KVCache) -> None:
        """Plan one forward pass: gather indices, masks, kernel metadata. Called once per pass,
        before the first layer; the plan is valid until the next `begin`."""

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
