"""A reservation's decode ranks (tensor parallelism) <-> KVRank messages."""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.parallel.kv_ranks import MAX_RANKS, RankEnd
from pdserve.rpc.bounds import check_kv_address
from pdserve.rpc.convert import WireError
from pdserve.transfer.head_slices import HeadRange
from pdserve.v1 import worker_pb2 as wpb


def kv_ranks_to_pb(ends: Sequence[RankEnd]) -> list[wpb.KVRank]:
    """None for a worker of one rank: the reservation's single-address form says it all."""
    if len(ends) < 2:
        return []
    return [wpb.KVRank(kv_address=e.address, head_start=e.heads.start, head_end=e.heads.stop) for e in ends]


def kv_ranks_from_pb(ranks: Sequence[wpb.KVRank]) -> tuple[RankEnd, ...]:
    """Addresses and the count bounded here; whether the heads fit is the prefill worker's check."""
    if len(ranks) > MAX_RANKS:
        raise WireError(f"{len(ranks)} decode ranks; at most {MAX_RANKS}")
    return tuple(RankEnd(check_kv_address(r.kv_address), HeadRange(r.head_start, r.head_end)) for r in ranks)
