"""The radix prefix cache of a pool of layer groups (pdserve/kv/page_groups.py): a node per full
block, holding that block's page in every group, NULL_PAGE where a windowed group's page is gone.

    root ── (t0..t15) [g0: 7, g1: -, g2: -] ── (t16..t31) [g0: 9, g1: 4, g2: 5] ── ...

Block tables and the `blocks` of matches and inserts are flat, G entries per block (as a table).

A match must leave the request every page its next query reads: the global groups' pages of the
whole prefix and each windowed group's pages of the blocks in its window. So a match ends at the
deepest node whose windowed pages are there for the window before it; the windowed entries
before that window come back NULL_PAGE (the request does not hold them).

Eviction is LRU over unreferenced pages. A windowed page leaves its node (the node stays: its
other groups still hold KV); a global group's page takes its node and every page of it along.
NOTE: a request holds the global pages of its whole path and gives them back leaf first (as in
radix_cache.py), so the least recently released global page is a leaf's; and a node whose global
pages nobody holds has no holder of its windowed pages either (they are held with them).
"""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.kv.block_pool import BlockPool
from pdserve.kv.page_groups import NULL_PAGE, PageGroups
from pdserve.kv.prefix_cache import InsertResult, MatchResult, PrefixCache, PrefixHandle, block_keys, tree_nodes


class _Node:
    __slots__ = ("key", "pages", "parent", "children", "depth")

    def __init__(self, key: tuple[int, ...], pages: list[int], parent: _Node | None, depth: int):
        self.key = key
        self.pages = pages  # one per group, NULL_PAGE where the group's page is gone
        self.parent = parent
        self.children: dict[tuple[int, ...], _Node] = {}
        self.depth = depth


class GroupedRadixCache(PrefixCache):
    def __init__(self, pool: BlockPool, block_size: int, groups: PageGroups):
        self.block_size = block_size
        self._pool = pool
        self._groups = groups
        self._g = groups.count
        self._windowed = [g for g in range(groups.count) if groups.windows[g] is not None]
        self._root = _Node((), [NULL_PAGE] * self._g, None, 0)
        self._by_page: dict[int, _Node] = {}

    def match(self, token_ids: Sequence[int]) -> MatchResult:
        path, node = [], self._root
        for i in range(len(token_ids) // self.block_size):
            node = node.children.get(tuple(token_ids[i * self.block_size:(i + 1) * self.block_size]))
            if node is None:
                break
            path.append(node)
        depth = self._usable(path)
        entries: list[int] = []
        for i, step in enumerate(path[:depth]):
            entries.extend(step.pages)
        for g in self._windowed:
            for i in range(self._groups.dead_blocks(g, depth * self.block_size, self.block_size)):
                entries[i * self._g + g] = NULL_PAGE
        return MatchResult(tuple(entries), depth * self.block_size, path[depth - 1] if depth else self._root)

    def _usable(self, path: list[_Node]) -> int:
        """The deepest depth whose windowed groups hold every page of their window before it."""
        runs = {g: _runs([node.pages[g] != NULL_PAGE for node in path]) for g in self._windowed}
        for depth in range(len(path), 0, -1):
            start = depth * self.block_size
            if all(runs[g][depth - 1] >= depth - self._groups.dead_blocks(g, start, self.block_size)
                   for g in self._windowed):
                return depth
        return 0

    def insert(self, token_ids: Sequence[int], blocks: Sequence[int],
               after: PrefixHandle | None = None) -> InsertResult:
        node = after if isinstance(after, _Node) else self._root
        first, num_new, cached = node.depth, 0, []
        end = min(len(token_ids) // self.block_size, len(blocks) // self._g)
        for i, key in enumerate(block_keys(token_ids, self.block_size, first, end), start=first):
            own = blocks[i * self._g:(i + 1) * self._g]
            child = node.children.get(key)
            if child is None:
                child = _Node(key, [NULL_PAGE] * self._g, node, node.depth + 1)
                node.children[key] = child
            for g, page in enumerate(own):
                if page != NULL_PAGE and child.pages[g] == NULL_PAGE:
                    self._take(child, g, page)
                    num_new += 1
            cached.extend(NULL_PAGE if page == NULL_PAGE else child.pages[g] for g, page in enumerate(own))
            node = child
        return InsertResult(first * self._g, tuple(cached), num_new, node)

    def _take(self, node: _Node, group: int, page: int) -> None:
        self._pool.mark_cached(page)
        node.pages[group] = page
        self._by_page[page] = node

    def evict(self, num_blocks: int) -> int:
        freed = 0
        while freed < num_blocks:
            victims = self._pool.least_recently_cached(1)
            if not victims:
                break
            freed += self._evict(victims[0])
        return freed

    def _evict(self, page: int) -> int:
        node = self._by_page[page]
        group = node.pages.index(page)
        if self._groups.windows[group] is not None:
            self._drop(node, group)
            return 1
        assert not node.children, "an unreferenced global page has cached descendants"
        del node.parent.children[node.key]
        live = [g for g in range(self._g) if node.pages[g] != NULL_PAGE]
        for g in live:
            self._drop(node, g)
        return len(live)

    def _drop(self, node: _Node, group: int) -> None:
        page = node.pages[group]
        node.pages[group] = NULL_PAGE
        del self._by_page[page]
        self._pool.evict(page)

    def num_blocks(self) -> int:
        return len(self._by_page)

    def check_integrity(self, pool: BlockPool) -> None:
        nodes = list(tree_nodes(self._root))
        pages = [(p, n) for n in nodes for p in n.pages if p != NULL_PAGE]
        assert len({p for p, _ in pages}) == len(pages), "a page sits in two nodes or groups"
        assert {p: n for p, n in pages} == self._by_page, "page index drifted"
        held = {b for b in range(pool.num_blocks) if pool.is_cache_held(b)}
        assert held == set(self._by_page), f"cache-held pages differ from tree pages: {sorted(held ^ set(self._by_page))[:8]}"
        globals_ = [g for g in range(self._g) if self._groups.windows[g] is None]
        for node in nodes:
            assert len(node.key) == self.block_size
            assert node.parent is not None and node.parent.children.get(node.key) is node
            assert all(node.pages[g] != NULL_PAGE for g in globals_), "a node without its global pages"
            if node.parent is not self._root and any(pool.refcount(node.pages[g]) > 0 for g in globals_):
                assert all(pool.refcount(node.parent.pages[g]) > 0 for g in globals_), \
                    "a referenced block under an unreferenced one"


def _runs(present: list[bool]) -> list[int]:
    """For each index, how many entries up to and including it are present in a row."""
    out, run = [], 0
    for here in present:
        run = run + 1 if here else 0
        out.append(run)
    return out
