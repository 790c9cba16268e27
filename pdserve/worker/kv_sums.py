"""The checksums a worker sends with its KV (pdserve/transfer/checksum.py), and the one fault a test
may inject into that KV.

A sender sums each piece's blocks while the transport sends them (both only read the blocks, which
the piece's hold keeps), so summing costs no time on the send's path unless the sum is the slower
of the two. Only a sender of one rank whose pool is in host memory sums (`KVSums.of`): its
CompleteKV carries one sum per piece; any other sends none and nothing is checked.

Fault injection, for tests only, and off unless PDSERVE_KV_CORRUPT_FILE names a path: when a piece
is sent while that file exists, the sender claims it (renames it away), sums the piece, flips one
byte of its first block, sends it, and flips the byte back. `{pid}` in the path stands for the
process id.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import torch

from pdserve.engine.faults import claim_file
from pdserve.transfer.base import pool_bytes
from pdserve.transfer.checksum import blocks_checksum_off_loop, summable

CORRUPT_ENV = "PDSERVE_KV_CORRUPT_FILE"
T = TypeVar("T")


class CorruptTrigger:
    """Arms one corruption each time `path` appears."""

    def __init__(self, path: Path):
        self.path = path
        self._claimed = path.with_name(f"{path.name}.{os.getpid()}.claimed")

    def claim(self) -> bool:
        return claim_file(self.path, self._claimed) is not None


def corrupt_trigger_from_env(env: Mapping[str, str]) -> CorruptTrigger | None:
    path = env.get(CORRUPT_ENV)
    return CorruptTrigger(Path(path.replace("{pid}", str(os.getpid())))) if path else None


class KVSums:
    def __init__(self, pool: torch.Tensor, corrupt: CorruptTrigger | None = None):
        self.pool = pool
        self.corrupt = corrupt

    @classmethod
    def of(cls, on: bool, pool: torch.Tensor, ranks: int, env: Mapping[str, str] = os.environ) -> "KVSums | None":
        """A sender's sums: None when off, or where it cannot sum (a GPU pool, several ranks)."""
        if not on or ranks != 1 or not summable(pool):
            return None
        return cls(pool, corrupt_trigger_from_env(env))

    async def send(self, blocks: Sequence[int], send: Callable[[], Awaitable[T]]) -> tuple[T, int]:
        """`send()`'s result and the sum of `blocks` as they are sent."""
        if self.corrupt is not None and self.corrupt.claim():
            checksum = await blocks_checksum_off_loop(self.pool, blocks)
            row = pool_bytes(self.pool)[blocks[0]]
            row[0] ^= 0xFF
            try:
                return await send(), checksum
            finally:
                row[0] ^= 0xFF
        summing = asyncio.ensure_future(blocks_checksum_off_loop(self.pool, blocks))
        try:
            result = await send()
        finally:
            checksum = await asyncio.shield(summing)  # its thread reads the blocks: done before their hold ends
        return result, checksum
