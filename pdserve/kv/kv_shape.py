"""The shape of one KV block: what a pool's size and a transfer's bytes are computed from. Pure
Python, so a process that only sizes pools (the router, the deploy checks) needs no torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int

    def block_numel(self) -> int:
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim
