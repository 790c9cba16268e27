"""The paged KV pool: one tensor of fixed-size blocks, owned by the worker that allocated it.

Layout, block-major so that one block (all layers, K and V) is one contiguous byte range and
runs of consecutive block ids merge into one transfer or one swap copy:

    data: [num_blocks, num_layers, 2 (K, V), block_size, num_kv_heads, head_dim]

A hybrid model's pool holds pages of one layer group each (pdserve/kv/page_groups.py): then
num_layers is the layers of a page, and a model layer is found at its slot within its group's
pages (`slot`); the block tables the backends read are per group.

Mechanism only: which block belongs to whom is decided by the KV manager.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from pdserve.kv.block_runs import merge_runs
from pdserve.kv.host_memory import zeroed_host_tensor
from pdserve.kv.kv_shape import KVShape
from pdserve.kv.page_groups import PageGroups


class KVCache:
    def __init__(self, shape: KVShape, num_blocks: int, dtype: torch.dtype, device: str | torch.device,
                 pin_memory: bool = False, groups: PageGroups | None = None):
        """`shape`: a block of every layer. `pin_memory`: a host pool that a GPU copies into and
        out of asynchronously. `groups`: the layer groups of a hybrid model's pages (None: one
        group, a page is a block of every layer); `self.shape` is then one page's."""
        self.groups = groups or PageGroups.single(shape.num_layers)
        assert len(self.groups.layer_group) == shape.num_layers, "groups of another model's layers"
        self.shape = replace(shape, num_layers=self.groups.page_layers)
        self._slots = self.groups.layer_slot
        self.num_blocks = num_blocks
        shape = self.shape
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

    def slot(self, layer: int) -> int:
        """Where model layer `layer` sits within a page of its group."""
        return self._slots[layer]

    def layer(self, layer: int) -> torch.Tensor:
        """[num_blocks, 2, block_size, num_kv_heads, head_dim], a strided view of one layer (read
        through its group's block tables)."""
        return self.data[:, self._slots[layer]]

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [T, num_kv_heads, head_dim] written at flat slots [T] (of the layer's group), as
        the pool's elements (a half pool below a float32 model: rounded to nearest)."""
        blocks = torch.div(slot_mapping, self.block_size, rounding_mode="floor")
        offsets = slot_mapping % self.block_size
        slot, dtype = self._slots[layer], self.data.dtype
        self.data[blocks, slot, 0, offsets] = k.to(dtype)
        self.data[blocks, slot, 1, offsets] = v.to(dtype)

    def copy_blocks_to(self, dst: "KVCache", pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks src_id -> dst_id into another pool (swap out / swap in), one slice
        copy per run of consecutive ids (non-blocking between a GPU and pinned host memory)."""
        for run in merge_runs(pairs):
            dst.data[run.dst_start : run.dst_start + run.count].copy_(
                self.data[run.src_start : run.src_start + run.count], non_blocking=True)


def kv_pools(shape: KVShape, groups: PageGroups, num_blocks: int, num_host_blocks: int, dtype: torch.dtype,
             device: str | torch.device) -> tuple[KVCache, KVCache]:
    """A worker's device pool and host (swap) pool: as many bytes as `num_blocks` (and
    `num_host_blocks`) blocks of every layer, in pages of `groups`."""
    kv = KVCache(shape, groups.pages(num_blocks), dtype, device, groups=groups)
    host = KVCache(shape, groups.pages(num_host_blocks), dtype, "cpu",
                   pin_memory=torch.device(device).type == "cuda", groups=groups)
    return kv, host
