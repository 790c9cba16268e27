"""Layer groups of a KV pool: which layers a page holds, and which pages a request still needs.

A model whose layers all see the whole context keeps one group: a page is a block of every layer
(today's layout, `PageGroups.single`). A hybrid model (Gemma 3: five sliding-window layers to
each global one) splits its layers into groups of equal size, each group of one kind, so that a
page (one group's layers for `block_size` tokens) is the same size in every group and all groups
share one pool:

    Gemma 3 270M, 18 layers: 3 global (5, 11, 17), 15 local  ->  pages of 3 layers, 6 groups
      group 0: layers 5 11 17  (global: a page per block of the whole context)
      group 1: layers 0 1 2    (window W: only the pages of the last W positions are kept)
      ...
      group 5: layers 12 13 14

A request's table is flat, one page per (block, group), groups interleaved:

    table[i * G + g] = page of block i in group g, NULL_PAGE where the request no longer holds it
                       (a windowed group's block that every later query is past)

Pure Python: a process that only sizes pools needs no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

NULL_PAGE = -1  # a table entry whose page was given back (out of its group's window)
WIRE_NULL_PAGE = 0xFFFFFFFF  # NULL_PAGE as the wire's unsigned block ids carry it


@dataclass(frozen=True)
class PageGroups:
    page_layers: int  # layers in one page
    windows: tuple[int | None, ...]  # per group: positions each query sees (None: all)
    layer_group: tuple[int, ...]  # per model layer: its group
    layer_slot: tuple[int, ...]  # per model layer: its place within the group's pages

    @staticmethod
    def single(num_layers: int) -> PageGroups:
        return PageGroups(num_layers, (None,), (0,) * num_layers, tuple(range(num_layers)))

    @staticmethod
    def of(windows: Sequence[int | None]) -> PageGroups:
        """Groups for per-layer windows (empty, or all alike: one group, nothing given back)."""
        kinds = tuple(dict.fromkeys(windows))
        if len(kinds) < 2:
            return PageGroups.single(len(windows))
        members = {kind: [layer for layer, w in enumerate(windows) if w == kind] for kind in kinds}
        size = math.gcd(*(len(layers) for layers in members.values()))
        order = sorted(kinds, key=lambda w: (w is not None, w or 0))  # the global group(s) first
        group_windows: list[int | None] = []
        layer_group, layer_slot = [0] * len(windows), [0] * len(windows)
        for kind in order:
            layers = members[kind]
            for first in range(0, len(layers), size):
                for slot, layer in enumerate(layers[first:first + size]):
                    layer_group[layer], layer_slot[layer] = len(group_windows), slot
                group_windows.append(kind)
        return PageGroups(size, tuple(group_windows), tuple(layer_group), tuple(layer_slot))

    @property
    def count(self) -> int:
        return len(self.windows)

    @property
    def windowed(self) -> bool:
        """Some group gives pages back as its window moves."""
        return self.count > 1

    def pages(self, num_blocks: int) -> int:
        """Table entries of `num_blocks` blocks."""
        return num_blocks * self.count

    def dead_blocks(self, group: int, start: int, block_size: int) -> int:
        """Leading blocks of `group` that no query at a position >= start sees."""
        window = self.windows[group]
        return 0 if window is None else max(0, (start - window + 1) // block_size)

    def needed(self, num_blocks: int, start: int, block_size: int) -> list[bool]:
        """For a table of num_blocks blocks whose next query is at `start`: which entries are kept."""
        dead = [self.dead_blocks(g, start, block_size) for g in range(self.count)]
        return [i >= dead[g] for i in range(num_blocks) for g in range(self.count)]


def pages_to_wire(pages: Sequence[int]) -> list[int]:
    return [WIRE_NULL_PAGE if p == NULL_PAGE else p for p in pages]


def pages_from_wire(pages: Sequence[int]) -> tuple[int, ...]:
    return tuple(NULL_PAGE if p == WIRE_NULL_PAGE else p for p in pages)


def live_pairs(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int]]:
    """(src, dst) page pairs of a transfer: entries the receiver holds no page for are not sent.
    ValueError where the receiver needs a page the sender gave back."""
    pairs = []
    for s, d in zip(src, dst):
        if d == NULL_PAGE:
            continue
        if s == NULL_PAGE:
            raise ValueError("the receiver needs KV of a windowed layer group the sender no longer holds")
        pairs.append((s, d))
    return pairs
