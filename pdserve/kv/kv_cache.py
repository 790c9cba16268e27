"""The paged KV pool: one tensor of fixed-size blocks, owned by the worker that allocated it.

Layout, block-major so that one block (all layers, K and V) is one contiguous byte range and
runs of consecutive block ids merge into one transfer or one swap copy:

    data: [num_blocks, num_layers, 2 (K, V), block_size, num_kv_heads, head_dim]

Mechanism only: which block belongs to whom is decided by the KV manager.
"""

from __future__ import annotations

import torch

from pdserve.kv.block_runs import merge_runs
from pdserve.kv.host_memory import zeroed_host_tensor
from pdserve.kv.kv_shape import KVShape


class KVCache:
    def __init__(self, shape: KVShape, num_blocks: int, dtype: torch.dtype, device: str | torch.device,
                 pin_memory: bool = False):
        """`pin_memory`: a host pool that a GPU copies into and out of asynchronously."""
        self.shape = shape
        self.num_blocks = num_blocks
        dims = (num_blocks, shape.num_layers, 2, shape.block_size, shape.num_kv_heads, shape.head_dim)
        if torch.device(device).type == "cpu" and not pin_memory:
            self.data = zeroed_host_tensor(dims, dtype)  # huge pages: faster transfers and swaps
        else:
            self.data = torch.zeros(dims, dtype=dtype, device=device, pin_memory=pin_memory)

    @property
    def block_size(self) -> int:
        return self.shape.block_size

    @property
    def block_nbytes(self) -> int:
        return self.shape.block_numel() * self.data.element_size()

    def layer(self, layer: int) -> torch.Tensor:
        """[num_blocks, 2, block_size, num_kv_heads, head_dim], a strided view of one layer."""
        return self.data[:, layer]

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [T, num_kv_heads, head_dim] written at flat slots [T]."""
        blocks = torch.div(slot_mapping, self.block_size, rounding_mode="floor")
        offsets = slot_mapping % self.block_size
        self.data[blocks, layer, 0, offsets] = k
        self.data[blocks, layer, 1, offsets] = v

    def copy_blocks_to(self, dst: "KVCache", pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks src_id -> dst_id into another pool (swap out / swap in), one slice
        copy per run of consecutive ids (non-blocking between a GPU and pinned host memory)."""
        for run in merge_runs(pairs):
            dst.data[run.dst_start : run.dst_start + run.count].copy_(
                self.data[run.src_start : run.src_start + run.count], non_blocking=True)
