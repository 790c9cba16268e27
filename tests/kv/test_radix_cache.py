from __future__ import annotations

from pdserve.kv.block_pool import BlockPool, BlockState
from pdserve.kv.no_prefix_cache import NoPrefixCache
from pdserve.kv.radix_cache import RadixPrefixCache

B = 4


def cache_with(pool: BlockPool, tokens: list[int]) -> tuple[RadixPrefixCache, tuple[int, ...]]:
    cache = RadixPrefixCache(pool, B)
    blocks = pool.allocate(len(tokens) // B).blocks
    cache.insert(tokens, blocks)
    return cache, blocks


def test_match_only_full_blocks_of_an_equal_prefix() -> None:
    pool = BlockPool(8)
    tokens = list(range(12))
    cache, blocks = cache_with(pool, tokens)
    assert cache.match(tokens).blocks == blocks
    hit = cache.match(tokens[:10] + [99, 99])
    assert hit.blocks == blocks[:2] and hit.num_tokens == 8
    assert cache.match([1] + tokens[1:]).num_tokens == 0  # the first block differs
    assert cache.match(tokens[:7]).blocks == blocks[:1]  # a partial block never matches


def test_insert_reports_an_equal_block_cached_earlier() -> None:
    pool = BlockPool(8)
    tokens = list(range(8))
    cache, first = cache_with(pool, tokens)
    second = pool.allocate(2).blocks
    result = cache.insert(tokens + [50, 51, 52, 53], [*second, *pool.allocate(1).blocks])
    assert result.first == 0 and result.blocks[:2] == first and result.num_new == 1
    assert cache.num_blocks() == 3


def test_insert_continues_after_a_handle() -> None:
    pool = BlockPool(8)
    cache = RadixPrefixCache(pool, B)
    blocks = pool.allocate(3).blocks
    tokens = list(range(12))
    start = cache.insert(tokens[:4], blocks)
    result = cache.insert(tokens, blocks, after=start.last)
    assert result.first == 1 and result.blocks == blocks[1:] and result.last.depth == 3
    assert cache.match(tokens).blocks == blocks


def test_eviction_takes_least_recently_released_leaves_first() -> None:
    pool = BlockPool(8)
    cache = RadixPrefixCache(pool, B)
    a = pool.allocate(2).blocks
    cache.insert(list(range(8)), a)
    pool.incref(a[0])  # a second request shares the first block and branches off
    b = (a[0], *pool.allocate(1).blocks)
    cache.insert(list(range(4)) + [9, 9, 9, 9], b)
    pool.free(a)
    pool.free(b)  # released last: b's branch is the most recently used
    assert pool.num_cached == 3
    assert cache.evict(1) == 1
    assert pool.state(a[1]) == BlockState.FREE and pool.state(b[1]) == BlockState.CACHED
    assert cache.evict(5) == 2  # then b's leaf, then the shared parent (a leaf by then)
    assert pool.num_free == 8 and cache.num_blocks() == 0
    cache.check_integrity(pool)


def test_a_revived_prefix_becomes_recent_again() -> None:
    pool = BlockPool(8)
    cache = RadixPrefixCache(pool, B)
    old, new = pool.allocate(1).blocks, pool.allocate(1).blocks
    cache.insert([1] * 4, old)
    cache.insert([2] * 4, new)
    pool.free(old)
    pool.free(new)
    hit = cache.match([1] * 4)
    pool.incref(hit.blocks[0])  # a request reuses the old prefix...
    pool.free(hit.blocks)  # ...and releases it
    cache.evict(1)
    assert pool.state(new[0]) == BlockState.FREE and pool.state(old[0]) == BlockState.CACHED


def test_referenced_blocks_are_never_evicted() -> None:
    pool = BlockPool(4)
    cache, blocks = cache_with(pool, list(range(8)))
    assert cache.evict(2) == 0
    pool.decref(blocks[1])
    assert cache.evict(2) == 1 and pool.state(blocks[0]) == BlockState.ACTIVE
    cache.check_integrity(pool)


def test_no_prefix_cache_has_the_same_interface_and_caches_nothing() -> None:
    pool = BlockPool(4)
    cache = NoPrefixCache(B)
    blocks = pool.allocate(2).blocks
    result = cache.insert(list(range(8)), blocks)
    assert result.blocks == blocks and result.num_new == 0
    assert cache.match(list(range(8))).num_tokens == 0
    pool.free(blocks)
    assert pool.num_free == 4 and cache.evict(4) == 0
    cache.check_integrity(pool)
