"""Block ids of one KV pool: free list, reference counts, prefix-cache holds.

Every block is in exactly one state:

    FREE     on the free list, refcount 0
    ACTIVE   refcount > 0 (block tables of requests, holds); may also be held by the prefix cache
    CACHED   refcount 0 but held by the prefix cache: its KV is valid, it can be evicted

    allocate ──> ACTIVE ──decref to 0──> FREE             (not held by the prefix cache)
                   │  └────decref to 0──> CACHED ──evict──> FREE
                   └── mark_cached (prefix cache takes it)    └─incref─> ACTIVE (prefix hit)

CACHED blocks are kept in the order they became CACHED (least recently released first).
NOTE: a holder releases a path of blocks leaf first (`free` does), so a cached block always
became CACHED after its cached descendants: the oldest CACHED block is a leaf of the prefix tree.

The host swap pool is a second instance: its ACTIVE blocks are the swapped ones.
Mechanism only: which request owns a block is recorded by the KV manager.
"""

from __future__ import annotations

import enum
import itertools
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
        self._cached: dict[int, None] = {}  # insertion-ordered: least recently released first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_active(self) -> int:
        return self.num_blocks - len(self._free) - len(self._cached)

    def least_recently_cached(self, n: int) -> list[int]:
        """Up to n CACHED blocks, the longest unreferenced first."""
        return list(itertools.islice(self._cached, n))

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
            del self._cached[block]
        self._refs[block] += 1

    def decref(self, block: int) -> None:
        refs = self._refs[block]
        if refs == 0:
            raise BlockStateError(f"decref of unreferenced block {block} (double free)")
        self._refs[block] = refs - 1
        if refs > 1:
            return
        if self._cache_held[block]:
            self._cached[block] = None
        else:
            self._free.append(block)

    def free(self, blocks: list[int] | tuple[int, ...]) -> None:
        """Drop one reference to each block of a path, last block first."""
        for block in reversed(blocks):
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
        del self._cached[block]
        self._free.append(block)

    def check_integrity(self) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        for block in free:
            assert self._refs[block] == 0 and not self._cache_held[block], f"free block {block} in use"
        cached = {b for b in range(self.num_blocks) if self._refs[b] == 0 and self._cache_held[b]}
        assert cached == set(self._cached), "the cached set drifted"
        lost = [b for b in range(self.num_blocks) if self._refs[b] == 0 and not self._cache_held[b]
                and b not in free]
        assert not lost, f"blocks leaked (refcount 0, not free, not cached): {lost[:8]}"
        assert all(r >= 0 for r in self._refs)
        assert self.num_free + self.num_cached + self.num_active == self.num_blocks
