"""Pools and loop runners shared by the transfer tests (and their child processes)."""

import asyncio
import os

import torch

from pdserve.kv.kv_cache import KVCache
from pdserve.kv.kv_shape import KVShape

os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")

# 4 layers x K,V x 16 tokens x 2 heads x 64 dims x fp32 = 64 KiB per block: above UCX's
# eager limit, so data takes the rendezvous path as real KV does.
SHAPE = KVShape(num_layers=4, num_kv_heads=2, head_dim=64, block_size=16)
NUM_BLOCKS = 32
SECRET = bytes(range(16))  # the transfer secret both ends of a test piece hold


def make_pool(fill: bool, num_blocks: int = NUM_BLOCKS, shape: KVShape = SHAPE) -> torch.Tensor:
    """[num_blocks, layers, 2, block_size, heads, head_dim]; fill: block b holds values b + 1 + noise."""
    pool = KVCache(shape, num_blocks, torch.float32, "cpu").data
    if fill:
        ids = torch.arange(num_blocks, dtype=torch.float32).view(-1, 1, 1, 1, 1, 1)
        pool.copy_(ids + 1 + torch.rand_like(pool) * 0.5)
    return pool


async def posted(receiver, transfer_id: str, seqs=(0,), until_done: asyncio.Future | None = None,
                 timeout_s: float = 10.0) -> None:
    """Until `receiver` has posted the receives of pieces `seqs` of `transfer_id` (both transports
    keep their live pieces in a ledger), or `until_done` (the expect itself) ended first."""
    from tests.helpers.waiting import async_wait_until

    def ready() -> bool:
        live = all(receiver._ledger.lookup(transfer_id, seq) is not None for seq in seqs)
        return live or (until_done is not None and until_done.done())

    await async_wait_until(ready, timeout_s, f"receives of {transfer_id!r} pieces {list(seqs)} posted")


def run(coro, loop: str = "asyncio"):
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)
