"""The KV manager's queries over many requests at once: decodes whose tables have room, and
caching the newly full blocks of a run of requests."""

from __future__ import annotations

from pdserve.config import CacheConfig
from pdserve.kv.block_pool import Allocated
from pdserve.kv.manager import KVManager
from pdserve.requests import Request

B = 4


def decoding(kv: KVManager, rid: str, num_tokens: int) -> Request:
    """A request with KV for all but its last token (a decode), tables exactly covering it."""
    r = Request(rid, [ord(rid) * 100 + i for i in range(num_tokens)])
    assert isinstance(kv.admit(r, kv.match(r), num_tokens - 1), Allocated)
    r.num_computed_tokens = num_tokens - 1
    return r


def test_tables_with_room_stop_at_the_first_decode_needing_a_block() -> None:
    kv = KVManager(CacheConfig(B, 32, 0, 0.0, True))
    # computed 5, 6, 8, 3: the third has filled its two blocks, the others have room
    requests = [decoding(kv, rid, n) for rid, n in (("a", 6), ("b", 7), ("c", 9), ("d", 4))]
    assert kv.tables_with_room(requests, 0, 10) == [kv.block_table("a"), kv.block_table("b")]
    assert kv.tables_with_room(requests, 0, 1) == [kv.block_table("a")]
    assert kv.tables_with_room(requests, 2, 10) == []
    assert kv.tables_with_room(requests, 3, 10) == [kv.block_table("d")]
    free = kv.device.num_free
    for r in requests:  # one allocate_slots each agrees: only c takes a block
        kv.allocate_slots(r, 1)
        free -= r.request_id == "c"
        assert kv.device.num_free == free
    kv.check_integrity()


def test_cache_all_computed_caches_each_newly_full_block_as_cache_computed() -> None:
    kv, one_by_one = (KVManager(CacheConfig(B, 32, 0, 0.0, True)) for _ in range(2))
    for manager in (kv, one_by_one):
        requests = [decoding(manager, rid, n) for rid, n in (("a", 9), ("b", 6), ("c", 13))]
        for r in requests:
            r.num_computed_tokens += 1  # the decode ran: a and c complete a block, b does not
        if manager is kv:
            manager.cache_all_computed(requests)
        else:
            for r in requests:
                manager.cache_computed(r)
    assert kv.stats() == one_by_one.stats()
    assert [kv.block_table(r) for r in "abc"] == [one_by_one.block_table(r) for r in "abc"]
    assert kv.prefix.num_blocks() == 2 + 1 + 3
    kv.check_integrity()
