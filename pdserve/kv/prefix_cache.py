"""The prefix cache interface: which device blocks already hold the KV of a token prefix.

Granularity is one full block: block i of a sequence holds tokens [i*B, (i+1)*B) and is only
cached once all B of them are computed. A cached block is found again by the exact token ids
of every block up to and including it, so equal prefixes share blocks.

Two implementations side by side: `RadixPrefixCache` (radix_cache.py) and `NoPrefixCache`
(no_prefix_cache.py). `make_prefix_cache` (prefix_caches.py) picks one from the config; callers
never branch on it.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from pdserve.kv.block_pool import BlockPool


class PrefixHandle(Protocol):
    """Opaque place in the cache, `depth` blocks below the root. Valid while the caller holds a
    reference to the block it ends at (a referenced block is never evicted)."""

    depth: int


class MatchResult(NamedTuple):
    blocks: tuple[int, ...]  # cached blocks of the longest cached prefix, in order
    num_tokens: int  # len(blocks) * block_size
    last: PrefixHandle  # where the match ended; pass to `insert` to continue from there


class InsertResult(NamedTuple):
    first: int  # index of the first block this insert covered (the `after` handle's depth)
    blocks: tuple[int, ...]  # the cached block for each covered index, from `first` on
    num_new: int  # blocks newly taken by the cache
    last: PrefixHandle


class PrefixCache(abc.ABC):
    """NOTE: the cache never changes reference counts. A caller that keeps a matched block
    increfs it before anything can evict; a block handed to `insert` must be referenced by
    the caller, and may come back replaced by an equal cached block (switch to that one)."""

    block_size: int

    @abc.abstractmethod
    def match(self, token_ids: Sequence[int]) -> MatchResult:
        """Longest cached prefix of the full blocks of token_ids (marks it recently used)."""

    @abc.abstractmethod
    def insert(self, token_ids: Sequence[int], blocks: Sequence[int],
               after: PrefixHandle | None = None) -> InsertResult:
        """Cache the full blocks of token_ids, block i held in blocks[i]. `after` (from an
        earlier match or insert of the same sequence) skips the blocks already on the path."""

    @abc.abstractmethod
    def evict(self, num_blocks: int) -> int:
        """Free up to num_blocks unreferenced blocks, least recently used leaves first.
        Returns how many were freed."""

    @abc.abstractmethod
    def num_blocks(self) -> int:
        """Blocks held by the cache (referenced or not)."""

    @abc.abstractmethod
    def check_integrity(self, pool: BlockPool) -> None:
        """Assert that the cache's blocks are exactly the pool's cache-held blocks."""


def block_keys(token_ids: Sequence[int], block_size: int, first: int, end: int) -> list[tuple[int, ...]]:
    """Token ids of blocks first..end-1, one tuple per block."""
    return [tuple(token_ids[i * block_size:(i + 1) * block_size]) for i in range(first, end)]



def tree_nodes(root):
    """Every node below `root` of a radix tree (nodes with a `children` dict), in no set order."""
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())
