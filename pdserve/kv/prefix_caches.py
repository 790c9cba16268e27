"""Which prefix cache a device pool gets: the radix tree where the config enables the cache, else
the one that caches nothing (prefix_cache.py is the interface)."""

from __future__ import annotations

from pdserve.kv.block_pool import BlockPool
from pdserve.kv.no_prefix_cache import NoPrefixCache
from pdserve.kv.prefix_cache import PrefixCache
from pdserve.kv.radix_cache import RadixPrefixCache


def make_prefix_cache(enabled: bool, pool: BlockPool, block_size: int) -> PrefixCache:
    return RadixPrefixCache(pool, block_size) if enabled else NoPrefixCache(block_size)
