"""A KV piece's checksum: xxh3-64 over its blocks' bytes, block after block, in the piece's order.

The sender computes it over the blocks it sends and announces it with the piece (PushKV); the
receiver computes it again over the blocks the data landed in, once the piece is in and before
the request may decode from them, and a piece whose sums differ fails (pdserve.errors.ChecksumMismatch). Both
read a block as one contiguous byte range of a block-major pool (`pool_bytes`); the hash runs on
a thread of its own (xxhash releases the GIL), never on the event loop.

A pool on a GPU is not summed here (its bytes would cross to the host first): such a sender
announces no checksum, and a piece without one is not checked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import torch
import xxhash

from pdserve.transfer.base import pool_bytes

NONE = 0  # "no checksum" on the wire: a sum that happens to be 0 is sent as 1 (see blocks_checksum)


def summable(pool: torch.Tensor) -> bool:
    """Whether this process can sum blocks of `pool` where they lie (a host pool)."""
    return pool.device.type == "cpu"


def blocks_checksum(pool: torch.Tensor, blocks: Sequence[int]) -> int:
    """xxh3-64 over the bytes of `blocks` of `pool`, in order; never NONE."""
    rows = pool_bytes(pool)
    digest = xxhash.xxh3_64()
    for block in blocks:
        digest.update(memoryview(rows[block].numpy()))
    return digest.intdigest() or 1


async def blocks_checksum_off_loop(pool: torch.Tensor, blocks: Sequence[int]) -> int:
    return await asyncio.to_thread(blocks_checksum, pool, tuple(blocks))
