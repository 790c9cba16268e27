"""Block ids of one KV pool: free list, reference counts, prefix-cache holds.

Every block is in exactly one state:

    FREE     on the free list, refcount 0
    ACTIVE   refcount > 0 (block tables of requests, holds); may also be held by the prefix cache
    CACHED   refcount 0 but held by the prefix cache: its KV is valid, it can be evicted

    allocate ──> ACTIVE ──decref to 0──> FREE             (not held by the prefix cache)
                   │  └────decref to 0──> CACHED ──evict──> FREE
                   └── mark_cached (prefix cache takes it)    └─incref─> ACTIVE (prefix hit)

The host swap pool is a second instance: its ACTIVE blocks are the swapped ones.
Mechanism only: which request owns a block is recorded by the KV manager.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass


class BlockState(enum.Enum):
    FREE = "free"
    ACTIVE = "active"
    CACHED = "cached"


class BlockStateError(RuntimeError):
    """A block was used against its state: a double free, an incref of a free block."""


@dataclass(frozen=True)
class Allocated:
    blocks: tuple[int, ...]


@dataclass(frozen=True)
class OutOfBlocks:
    needed: int  # blocks the caller asked for, reserve included
    available: int  # blocks it could have had (free, plus evictable where that applies)


Allocation = Allocated | OutOfBlocks


class BlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._refs = [0] * num_blocks
        self._cache_held = [False] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._num_cached = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return self._num_cached

    @property
    def num_active(self) -> int:
        return self.num_blocks - len(self._free) - self._num_cached

    def refcount(self, block: int) -> int:
        return self._refs[block]

    def is_cache_held(self, block: int) -> bool:
        return self._cache_held[block]

    def state(self, block: int) -> BlockState:
        if self._refs[block] > 0:
            return BlockState.ACTIVE
        return BlockState.CACHED if self._cache_held[block] else BlockState.FREE

    def allocate(self, n: int) -> Allocation:
        """Take n free blocks (refcount 1 each), lowest ids first, or nothing at all."""
        if n > len(self._free):
            return OutOfBlocks(n, len(self._free))
        blocks = tuple(self._free.popleft() for _ in range(n))
        for block in blocks:
            self._refs[block] = 1
        return Allocated(blocks)

    def incref(self, block: int) -> None:
        if self._refs[block] == 0:
            if not self._cache_held[block]:
                raise BlockStateError(f"incref of free block {block}")
            self._num_cached -= 1
        self._refs[block] += 1

    def decref(self, block: int) -> None:
        refs = self._refs[block]
        if refs == 0:
            raise BlockStateError(f"decref of unreferenced block {block} (double free)")
        self._refs[block] = refs - 1
        if refs > 1:
            return
        if self._cache_held[block]:
            self._num_cached += 1
        else:
            self._free.append(block)

    def free(self, blocks: list[int] | tuple[int, ...]) -> None:
        for block in blocks:
            self.decref(block)

    def mark_cached(self, block: int) -> None:
        """The prefix cache takes an active block: at refcount 0 it becomes CACHED, not FREE."""
        if self._refs[block] == 0 or self._cache_held[block]:
            raise BlockStateError(f"block {block} cannot enter the prefix cache ({self.state(block)})")
        self._cache_held[block] = True

    def evict(self, block: int) -> None:
        """The prefix cache lets go of a CACHED block: it becomes FREE."""
        if self._refs[block] != 0 or not self._cache_held[block]:
            raise BlockStateError(f"block {block} is not evictable ({self.state(block)})")
        self._cache_held[block] = False
        self._num_cached -= 1
        self._free.append(block)

    def check_integrity(self) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        for block in free:
            assert self._refs[block] == 0 and not self._cache_held[block], f"free block {block} in use"
        cached = sum(1 for b in range(self.num_blocks) if self._refs[b] == 0 and self._cache_held[b])
        assert cached == self._num_cached, f"cached count {self._num_cached} != {cached}"
        lost = [b for b in range(self.num_blocks) if self._refs[b] == 0 and not self._cache_held[b]
                and b not in free]
        assert not lost, f"blocks leaked (refcount 0, not free, not cached): {lost[:8]}"
        assert all(r >= 0 for r in self._refs)
        assert self.num_free + self.num_cached + self.num_active == self.num_blocks
