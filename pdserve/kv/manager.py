"""The KV manager: which device and host blocks each request holds.

It owns the device BlockPool, the host (swap) BlockPool, the prefix cache, every request's
block table and the holds. It allocates and frees; it never decides who runs (the scheduler
does) and never touches KV bytes (the executor copies `swap_out` / `swap_in` pairs).

    block table of a request, B = block_size, C = num_computed_tokens
    [ b0 | b1 | ... | b(k-1) ]   covers tokens [0, k*B), k = ceil((C + new) / B) after allocate_slots
      └─ full blocks of computed tokens ─┘ go into the prefix cache (cache_computed, free)

A hybrid model's pool (pdserve/kv/page_groups.py) holds pages of one layer group each: a block
table then has G entries per block (entry i * G + g: block i of group g), and a windowed group's
entries before its window are given back (NULL_PAGE) whenever the table grows, so a long request
holds its global groups' pages for the whole context and its local groups' for the window only.
Counts of blocks (`blocks_for`, `num_blocks`) stay in blocks of tokens; pool figures (available,
free, active, reserve) are in pages; its prefix cache is pdserve/kv/grouped_radix_cache.py.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pdserve.config import CacheConfig
from pdserve.kv.block_pool import Allocated, Allocation, BlockPool, OutOfBlocks
from pdserve.kv.page_groups import NULL_PAGE, PageGroups
from pdserve.kv.prefix_cache import InsertResult, MatchResult, PrefixHandle
from pdserve.kv.prefix_caches import make_prefix_cache
from pdserve.kv.tokens import TokenView
from pdserve.requests import Request


@dataclass(frozen=True)
class KVStats:
    free: int
    active: int
    cached: int
    swapped: int
    total: int
    host_total: int
    held: int = 0  # active blocks referenced by transfer holds (a send reads them)
    quarantined: int = 0  # active blocks only a quarantine hold keeps (a withdrawn receive may write them)


@dataclass(frozen=True, eq=False)
class BlockHold:
    """Extra references on a request's device blocks, so that neither the request's end nor its
    preemption nor eviction can recycle them while a KV transfer reads or writes them. Give them
    back with `KVManager.release`."""

    request_id: str
    blocks: tuple[int, ...]  # the request's block table when the hold was taken
    num_tokens: int  # leading tokens whose KV the blocks held then (num_computed_tokens)
    hold_id: int = 0
    quarantined: bool = False  # blocks a withdrawn receive may still write: out of use until released


class SwapPlan(NamedTuple):
    pairs: tuple[tuple[int, int], ...]  # (src block, dst block) for the executor to copy


SwapResult = SwapPlan | OutOfBlocks


class _Table:
    __slots__ = ("blocks", "allocated", "cursor", "num_cached")

    def __init__(self, blocks: list[int], cursor: PrefixHandle, num_cached: int):
        self.blocks = blocks
        self.allocated = Allocated(tuple(blocks))
        self.cursor = cursor  # prefix-cache node of block num_cached - 1
        self.num_cached = num_cached  # leading blocks already inserted into the prefix cache

    def refresh(self) -> None:
        self.allocated = Allocated(tuple(self.blocks))


class KVManager:
    def __init__(self, cfg: CacheConfig, groups: PageGroups | None = None):
        self.block_size = cfg.block_size
        self.groups = groups or PageGroups.single(1)
        self._g = self.groups.count  # table entries per block
        self.device = BlockPool(self.groups.pages(cfg.num_blocks))
        self.host = BlockPool(self.groups.pages(cfg.num_host_blocks))
        self.prefix = make_prefix_cache(cfg.prefix_cache, self.device, cfg.block_size, self.groups)
        self.watermark_blocks = int(cfg.watermark * self.device.num_blocks)
        self._tables: dict[str, _Table] = {}
        self._host_tables: dict[str, tuple[int, ...]] = {}
        self._holds: dict[int, BlockHold] = {}
        self._hold_ids = itertools.count(1)
        self._hold_refs: Counter[int] = Counter()  # block -> references held by holds
        self._quarantine_refs: Counter[int] = Counter()  # block -> of those, by quarantine holds
        self._host_releasing: list[int] = []

    @property
    def num_available(self) -> int:
        """Device blocks an allocation can get: free ones plus evictable cached ones."""
        return self.device.num_free + self.device.num_cached

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def pages_for(self, num_tokens: int) -> int:
        """Pages a table covering num_tokens tokens takes at most (its windowed groups' whole)."""
        return self._g * self.blocks_for(num_tokens)

    def num_blocks(self, request_id: str) -> int:
        """Blocks (of tokens) the request's device table covers."""
        return len(self._tables[request_id].blocks) // self._g

    def num_host_blocks(self, request_id: str) -> int:
        """Blocks (of tokens) the request's swapped-out table covers."""
        return len(self._host_tables.get(request_id, ())) // self._g

    def swap_in_cost(self, request_id: str) -> int:
        """Device pages `swap_in` takes (at most)."""
        return len(_live(self._host_tables.get(request_id, ())))

    def has_blocks(self, request_id: str) -> bool:
        return request_id in self._tables

    def block_table(self, request_id: str) -> tuple[int, ...]:
        return self._tables[request_id].allocated.blocks

    def host_blocks(self, request_id: str) -> tuple[int, ...]:
        return self._host_tables.get(request_id, ())

    def num_new_blocks(self, request: Request, num_new_tokens: int) -> int:
        """Pages allocate_slots would take for num_new_tokens more."""
        held = len(self._tables[request.request_id].blocks) if request.request_id in self._tables else 0
        return max(0, self.pages_for(request.num_computed_tokens + num_new_tokens) - held)

    def probe(self, token_ids: Sequence[int]) -> int:
        """Leading tokens of token_ids whose KV the prefix cache holds."""
        return self.prefix.match(token_ids).num_tokens

    def match(self, request: Request) -> MatchResult:
        """Cached prefix of the request. NOTE: the last token is never matched: it must go
        through the model to produce logits."""
        if request.prompt_logprobs_missing:  # every prompt position's logits are wanted: nothing cached serves
            return self.prefix.match(TokenView(request, 0))
        return self.prefix.match(TokenView(request, request.num_tokens - 1))

    def match_prompt(self, request: Request) -> MatchResult:
        """Cached prefix of the tokens whose KV comes from a prefill worker (the prompt, and a
        resume's tokens so far), short of the last: what a decode worker already holds of them
        (the prefill worker computes the last one's logits, so its block is always sent)."""
        return self.prefix.match(TokenView(request, request.num_remote_tokens - 1))

    def admission_cost(self, match: MatchResult, num_new_tokens: int) -> int:
        """How far `admit` would lower num_available: new blocks plus matched blocks that are
        cached (unreferenced) now."""
        revived = sum(1 for block in _live(match.blocks) if self.device.refcount(block) == 0)
        return self.pages_for(match.num_tokens + num_new_tokens) - len(match.blocks) + revived

    def admit(self, request: Request, match: MatchResult, num_new_tokens: int, reserve: int = 0,
              start: int | None = None) -> Allocation:
        """Give a request without blocks the matched prefix plus blocks for num_new_tokens more,
        leaving `reserve` blocks available afterwards; all or nothing. `start`: the position its
        next query is at (default: the first new token's), which windowed groups need the window of."""
        assert request.request_id not in self._tables, f"{request.request_id} already holds blocks"
        for block in _live(match.blocks):
            self.device.incref(block)
        end = match.num_tokens + num_new_tokens
        needed = self.groups.needed(self.blocks_for(end), match.num_tokens if start is None else start,
                                    self.block_size) if self.groups.windowed else None
        fresh = None if needed is None else needed[len(match.blocks):]
        count = self.pages_for(end) - len(match.blocks) if fresh is None else sum(fresh)
        result = self._take(count, reserve)
        if isinstance(result, OutOfBlocks):
            self.device.free(_live(match.blocks))
            return result
        pages = [*match.blocks, *(result.blocks if fresh is None else _spread(result.blocks, fresh))]
        table = _Table(pages, match.last, len(match.blocks) // self._g)
        self._tables[request.request_id] = table
        return table.allocated

    def reserve(self, request: Request, match: MatchResult, reserve: int = 0) -> Allocation:
        """Blocks for the remote KV (match_prompt's tokens): the matched prefix shared (its KV is
        here already), fresh blocks for the rest (their KV arrives from elsewhere). A windowed
        group gets pages for its window before the last of those tokens only: nothing else of it
        is ever read here, so nothing else of it is sent."""
        return self.admit(request, match, request.num_remote_tokens - match.num_tokens, reserve,
                          start=max(0, request.num_remote_tokens - 1))

    def allocate_slots(self, request: Request, num_new_tokens: int, reserve: int = 0) -> Allocation:
        """Blocks covering [0, num_computed_tokens + num_new_tokens); the whole table on success."""
        table = self._tables[request.request_id]
        need = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) * self._g - len(table.blocks)
        if need <= 0:  # every running decode, every step: pages_for inlined
            return table.allocated
        if self.groups.windowed:
            self._give_back(table, request.num_computed_tokens)
        result = self._take(need, reserve)
        if isinstance(result, OutOfBlocks):
            return result
        table.blocks.extend(result.blocks)
        table.refresh()
        return table.allocated

    def _give_back(self, table: _Table, start: int) -> None:
        """Free the pages of windowed groups that no query at `start` or later sees."""
        needed = self.groups.needed(len(table.blocks) // self._g, start, self.block_size)
        dead = [i for i, keep in enumerate(needed) if not keep and table.blocks[i] != NULL_PAGE]
        if dead:
            self.device.free([table.blocks[i] for i in dead])
            for i in dead:
                table.blocks[i] = NULL_PAGE
            table.refresh()

    def tables_with_room(self, requests: Sequence[Request], start: int, limit: int) -> list[tuple[int, ...]]:
        """Block tables of requests[start:], in order, while each already covers one more token
        (allocate_slots(request, 1) would allocate nothing); at most `limit`. One call for the
        decodes of a step that need no block, instead of one allocate_slots each."""
        tables, block_size, groups, out = self._tables, self.block_size, self._g, []
        for request in itertools.islice(requests, start, start + limit):
            table = tables[request.request_id]
            if request.num_computed_tokens * groups >= len(table.blocks) * block_size:
                break
            out.append(table.allocated.blocks)
        return out

    def _take(self, n: int, reserve: int) -> Allocation:
        if n + reserve > self.num_available:
            return OutOfBlocks(n + reserve, self.num_available)
        if n > self.device.num_free:
            self.prefix.evict(n - self.device.num_free)
        return self.device.allocate(n)

    def cache_computed(self, request: Request) -> None:
        """Insert the request's newly completed full blocks into the prefix cache, switching to
        an equal cached block where another request computed the same prefix first."""
        table = self._tables.get(request.request_id)
        full = request.num_computed_tokens // self.block_size
        if table is None or full <= table.num_cached:
            return
        result = self.prefix.insert(TokenView(request, full * self.block_size), table.blocks, table.cursor)
        self._adopt(table, result)
        table.cursor, table.num_cached = result.last, full

    def cache_all_computed(self, requests: Sequence[Request]) -> None:
        """cache_computed for each request in order; the step's many that completed no block
        cost no call."""
        tables, block_size = self._tables, self.block_size
        for request in requests:
            table = tables.get(request.request_id)
            if table is not None and request.num_computed_tokens // block_size > table.num_cached:
                self.cache_computed(request)

    def _adopt(self, table: _Table, result: InsertResult) -> None:
        changed = False
        for i, block in enumerate(result.blocks, start=result.first):
            own = table.blocks[i]
            if own != block:
                self.device.incref(block)
                self.device.decref(own)
                table.blocks[i] = block
                changed = True
        if changed:
            table.refresh()

    def free(self, request: Request) -> None:
        """Drop every block of the request; full computed blocks stay in the prefix cache."""
        self.cache_computed(request)
        table = self._tables.pop(request.request_id, None)
        if table is not None:
            self.device.free(_live(table.blocks))
        self.host.free(_live(self._host_tables.pop(request.request_id, ())))

    def swap_out(self, request: Request) -> SwapResult:
        """Move the blocks of computed tokens to host blocks: (device, host) pairs to copy before
        the next forward pass. The device blocks are released (full ones stay cached)."""
        table = self._tables[request.request_id]
        kept = table.blocks[: self.pages_for(request.num_computed_tokens)]
        live = _live(kept)
        host = self.host.allocate(len(live))
        if isinstance(host, OutOfBlocks):
            return host
        self.cache_computed(request)
        pairs = tuple(zip(live, host.blocks))
        self.device.free(_live(self._tables.pop(request.request_id).blocks))
        self._host_tables[request.request_id] = host.blocks if len(live) == len(kept) else \
            tuple(_spread(host.blocks, [b != NULL_PAGE for b in kept]))
        return SwapPlan(pairs)

    def swap_in(self, request: Request, reserve: int = 0) -> SwapResult:
        """Device blocks for a swapped request: (host, device) pairs to copy. Blocks still in the
        prefix cache are reused instead of copied. Host blocks are released at end_step."""
        host = self._host_tables[request.request_id]
        match = self.prefix.match(TokenView(request, request.num_computed_tokens))
        for block in _live(match.blocks):
            self.device.incref(block)
        live = _live(host[len(match.blocks):])
        result = self._take(len(live), reserve)
        if isinstance(result, OutOfBlocks):
            self.device.free(_live(match.blocks))
            return result
        rest = host[len(match.blocks):]
        pages = result.blocks if len(live) == len(rest) else _spread(result.blocks, [b != NULL_PAGE for b in rest])
        table = _Table([*match.blocks, *pages], match.last, len(match.blocks) // self._g)
        self._tables[request.request_id] = table
        del self._host_tables[request.request_id]
        self._host_releasing.extend(_live(host))
        return SwapPlan(tuple(zip(live, result.blocks)))

    def end_step(self) -> None:
        """The executor has run the step: host blocks read by its swap-ins may be reused.
        NOTE: not earlier: it copies swap_out before swap_in, so a host block freed by a swap-in
        and reused by a swap-out of the same step would be overwritten before it is read."""
        self.host.free(self._host_releasing)
        self._host_releasing = []

    def hold(self, request: Request, num_tokens: int | None = None) -> BlockHold:
        """Reference the device blocks holding the request's first num_tokens tokens (default:
        its computed tokens), after caching its full computed blocks. The request keeps its
        blocks; several holds may coexist.
        NOTE: holding at most one block that is not yet in the prefix cache keeps every holder's
        cached blocks a path from the root (what leaf-first eviction relies on)."""
        self.cache_computed(request)
        table = self._tables.get(request.request_id)
        count = self.blocks_for(request.num_computed_tokens if num_tokens is None else num_tokens)
        blocks = tuple(table.blocks[: count * self._g]) if table is not None else ()
        for block in _live(blocks):
            self.device.incref(block)
        self._hold_refs.update(_live(blocks))
        hold = BlockHold(request.request_id, blocks, min(request.num_computed_tokens, count * self.block_size),
                         next(self._hold_ids))
        self._holds[hold.hold_id] = hold
        return hold

    def quarantine(self, hold: BlockHold, blocks: Sequence[int]) -> BlockHold:
        """Narrow a live hold to those of its blocks in `blocks`, as a quarantine hold: the rest
        are given back now, these stay out of use until the returned hold is released."""
        assert hold.hold_id in self._holds, "quarantine of a released hold"
        unsafe = set(blocks)
        kept = tuple(b for b in hold.blocks if b in unsafe)
        for block in kept:
            self.device.incref(block)
        self._hold_refs.update(kept)
        self._quarantine_refs.update(kept)
        quarantined = BlockHold(hold.request_id, kept, 0, next(self._hold_ids), quarantined=True)
        self._holds[quarantined.hold_id] = quarantined
        self.release(hold)
        return quarantined

    def release(self, hold: BlockHold) -> None:
        """Give back a hold's references. Idempotent."""
        if self._holds.pop(hold.hold_id, None) is None:
            return
        live = _live(hold.blocks)
        _drop(self._hold_refs, live)
        if hold.quarantined:
            _drop(self._quarantine_refs, live)
        self.device.free(live)

    def num_held_only(self) -> int:
        """Blocks only holds keep: they come back when those holds are released."""
        return sum(1 for block, n in self._hold_refs.items() if self.device.refcount(block) == n)

    def holds(self) -> list[BlockHold]:
        return list(self._holds.values())

    def stats(self) -> KVStats:
        quarantine_only = sum(1 for b, n in self._quarantine_refs.items() if self._hold_refs[b] == n)
        return KVStats(self.device.num_free, self.device.num_active, self.device.num_cached,
                       self.host.num_active, self.device.num_blocks, self.host.num_blocks,
                       len(self._hold_refs) - quarantine_only, len(self._quarantine_refs))

    def check_integrity(self) -> None:
        self.device.check_integrity()
        self.host.check_integrity()
        self.prefix.check_integrity(self.device)
        device_refs = Counter(b for t in self._tables.values() for b in _live(t.blocks))
        held = Counter(b for h in self._holds.values() for b in _live(h.blocks))
        assert held == self._hold_refs, "hold references drifted"
        quarantined = Counter(b for h in self._holds.values() if h.quarantined for b in _live(h.blocks))
        assert quarantined == self._quarantine_refs, "quarantine references drifted"
        device_refs.update(held)
        for block in range(self.device.num_blocks):
            assert self.device.refcount(block) == device_refs[block], f"device block {block} refcount"
        host_refs = Counter(b for blocks in self._host_tables.values() for b in _live(blocks))
        host_refs.update(self._host_releasing)
        for block in range(self.host.num_blocks):
            assert self.host.refcount(block) == host_refs[block], f"host block {block} refcount"
        for table in self._tables.values():
            assert table.allocated.blocks == tuple(table.blocks)
            assert len(table.blocks) % self._g == 0, "a table covers part of a block's groups"
            assert table.cursor.depth == table.num_cached or table.cursor.depth == 0


def _drop(refs: Counter[int], blocks: Sequence[int]) -> None:
    for block in blocks:
        refs[block] -= 1
        if not refs[block]:
            del refs[block]


def _live(blocks: Sequence[int]) -> Sequence[int]:
    """The pages a table entry list holds (NULL_PAGE entries left out)."""
    return blocks if NULL_PAGE not in blocks else [b for b in blocks if b != NULL_PAGE]


def _spread(pages: Sequence[int], needed: Sequence[bool]) -> list[int]:
    """Table entries: the next of `pages` where needed, NULL_PAGE elsewhere."""
    taken = iter(pages)
    return [next(taken) if keep else NULL_PAGE for keep in needed]
