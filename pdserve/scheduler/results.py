"""Typed results the scheduler hands out besides the SchedulerOutput."""

from __future__ import annotations

from typing import NamedTuple

from pdserve.kv.manager import KVStats
from pdserve.requests import Request


class Reservation(NamedTuple):
    """Device blocks allocated for a remote request: block i holds prompt positions
    [i * block_size, (i + 1) * block_size). The first `cached_blocks` are shared prefix-cache
    hits (their KV is here already); the prefill worker writes the rest."""

    request: Request
    block_ids: tuple[int, ...]
    cached_blocks: int = 0


class SchedulerStats(NamedTuple):
    running: int  # holding device blocks and being computed
    waiting: int  # queued, no blocks (new, remote not yet reserved, or preempted by recompute)
    swapped: int  # preempted by swap: KV in host blocks
    kv: KVStats
    receiving: int = 0  # requests with blocks reserved, KV arriving from a prefill worker
    blocks_reserved: int = 0  # the blocks of those requests
