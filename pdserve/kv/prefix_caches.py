"""Which prefix cache a device pool gets: the radix tree where the config enables the cache, else
the one that caches nothing (prefix_cache.py is the interface)."""

from __future__ import annotations

from pdserve.kv.block_pool import BlockPool
from pdserve.kv.grouped_radix_cache import GroupedRadixCache
from pdserve.kv.no_prefix_cache import NoPrefixCache
from pdserve.kv.page_groups import PageGroups
from pdserve.kv.prefix_cache import PrefixCache
from pdserve.kv.radix_cache import RadixPrefixCache


def make_prefix_cache(enabled: bool, pool: BlockPool, block_size: int, groups: PageGroups | None = None) -> PrefixCache:
    """`groups`: the pool's layer groups, where some give pages back (a hybrid model's pool)."""
    if not enabled:
        return NoPrefixCache(block_size)
    if groups is not None and groups.windowed:
        return GroupedRadixCache(pool, block_size, groups)
    return RadixPrefixCache(pool, block_size)
