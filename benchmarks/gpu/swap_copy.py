"""The swap path's copies alone: KV blocks from the device pool to a pinned host pool and back,
as the model runner swaps them (KVCache.copy_blocks_to), timed and checked byte for byte."""

from __future__ import annotations

import torch

from benchmarks.gpu.common import Row, Verdict, median_seconds
from pdserve.kv.kv_cache import KVCache
from pdserve.kv.kv_shape import KVShape

LLAMA_8B_KV = KVShape(num_layers=32, num_kv_heads=8, head_dim=128, block_size=16)  # 2 MiB a block in bfloat16


def swap_copy_row(device: torch.device, shape: KVShape = LLAMA_8B_KV, blocks: int = 256,
                  dtype: torch.dtype = torch.bfloat16) -> Row:
    pool = KVCache(shape, 2 * blocks, dtype, device)
    host = KVCache(shape, blocks, dtype, "cpu", pin_memory=device.type == "cuda")
    pool.data.normal_()
    out_pairs = [(2 * i, i) for i in range(blocks)]  # every other device block: one copy per block
    in_pairs = [(i, i) for i in range(blocks)]  # into blocks 0..n-1: one run
    out_s = median_seconds(lambda: pool.copy_blocks_to(host, out_pairs), device, repeats=3)
    expected = pool.data[0::2].clone()
    pool.data[:blocks].zero_()
    in_s = median_seconds(lambda: host.copy_blocks_to(pool, in_pairs), device, repeats=3)
    exact = torch.equal(pool.data[:blocks], expected)
    nbytes = blocks * pool.block_nbytes
    result = (f"{blocks} blocks ({nbytes >> 20} MiB), host pinned: {host.data.is_pinned()}: out "
              f"{nbytes / out_s / 1e9:.1f} GB/s (block by block), in {nbytes / in_s / 1e9:.1f} GB/s (one run); "
              f"round trip exact: {exact}")
    return Row("kv: swap copies", result, Verdict.OK if exact else Verdict.FAIL)
