"""Radix tree over token ids at block granularity, with LRU eviction of unreferenced leaves.

    root ── (t0..t15) ── (t16..t31) ── (t32..t47)      one node per full block; the edge key is
                 │                └─── (u32..u47)      the block's B token ids, the node holds
                 └──── ...                             the device block with their KV

NOTE: requests reference whole prefixes (a block table is a path from the root) and release
them leaf first, so the least recently released CACHED block (BlockPool.least_recently_cached)
is always a leaf: eviction is LRU over unreferenced leaves in O(evicted).
"""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.kv.block_pool import BlockPool
from pdserve.kv.prefix_cache import InsertResult, MatchResult, PrefixCache, PrefixHandle, block_keys, tree_nodes


class _Node:
    __slots__ = ("key", "block", "parent", "children", "depth")

    def __init__(self, key: tuple[int, ...], block: int, parent: _Node | None, depth: int):
        self.key = key
        self.block = block
        self.parent = parent
        self.children: dict[tuple[int, ...], _Node] = {}
        self.depth = depth


class RadixPrefixCache(PrefixCache):
    def __init__(self, pool: BlockPool, block_size: int):
        self.block_size = block_size
        self._pool = pool
        self._root = _Node((), -1, None, 0)
        self._by_block: dict[int, _Node] = {}

    def match(self, token_ids: Sequence[int]) -> MatchResult:
        node, blocks = self._root, []
        for i in range(len(token_ids) // self.block_size):
            child = node.children.get(tuple(token_ids[i * self.block_size:(i + 1) * self.block_size]))
            if child is None:
                break
            node = child
            blocks.append(node.block)
        return MatchResult(tuple(blocks), len(blocks) * self.block_size, node)

    def insert(self, token_ids: Sequence[int], blocks: Sequence[int],
               after: PrefixHandle | None = None) -> InsertResult:
        node = after if isinstance(after, _Node) else self._root
        first, num_new = node.depth, 0
        end = min(len(token_ids) // self.block_size, len(blocks))
        cached = []
        for i, key in enumerate(block_keys(token_ids, self.block_size, first, end), start=first):
            child = node.children.get(key)
            if child is None:
                child = self._add_child(node, key, blocks[i])
                num_new += 1
            cached.append(child.block)
            node = child
        return InsertResult(first, tuple(cached), num_new, node)

    def _add_child(self, parent: _Node, key: tuple[int, ...], block: int) -> _Node:
        self._pool.mark_cached(block)
        child = _Node(key, block, parent, parent.depth + 1)
        parent.children[key] = child
        self._by_block[block] = child
        return child

    def evict(self, num_blocks: int) -> int:
        victims = self._pool.least_recently_cached(num_blocks)
        for block in victims:
            node = self._by_block.pop(block)
            assert not node.children, "an unreferenced block has cached descendants"
            del node.parent.children[node.key]
            self._pool.evict(block)
        return len(victims)

    def num_blocks(self) -> int:
        return len(self._by_block)

    def check_integrity(self, pool: BlockPool) -> None:
        nodes = list(tree_nodes(self._root))
        assert len(nodes) == len(self._by_block), "node count drifted"
        assert all(self._by_block[n.block] is n for n in nodes), "block index drifted"
        blocks = {n.block for n in nodes}
        assert len(blocks) == len(nodes), "a block sits in two nodes"
        held = {b for b in range(pool.num_blocks) if pool.is_cache_held(b)}
        assert blocks == held, f"cache-held blocks differ from tree blocks: {sorted(held ^ blocks)[:8]}"
        for node in nodes:
            assert len(node.key) == self.block_size
            assert node.parent is not None and node.parent.children.get(node.key) is node
            if pool.refcount(node.block) > 0 and node.parent is not self._root:
                assert pool.refcount(node.parent.block) > 0, "a referenced block under an unreferenced one"
