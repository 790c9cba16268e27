"""A prefix cache that caches nothing: every match is empty, every freed block goes free."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.kv.block_pool import BlockPool
from pdserve.kv.prefix_cache import InsertResult, MatchResult, PrefixCache, PrefixHandle


@dataclass(frozen=True)
class _Root:
    depth: int = 0


class NoPrefixCache(PrefixCache):
    def __init__(self, block_size: int):
        self.block_size = block_size
        self._root = _Root()

    def match(self, token_ids: Sequence[int]) -> MatchResult:
        return MatchResult((), 0, self._root)

    def insert(self, token_ids: Sequence[int], blocks: Sequence[int],
               after: PrefixHandle | None = None) -> InsertResult:
        end = min(len(token_ids) // self.block_size, len(blocks))
        return InsertResult(0, tuple(blocks[:end]), 0, self._root)

    def evict(self, num_blocks: int) -> int:
        return 0

    def num_blocks(self) -> int:
        return 0

    def check_integrity(self, pool: BlockPool) -> None:
        assert pool.num_cached == 0
        assert not any(pool.is_cache_held(b) for b in range(pool.num_blocks))
