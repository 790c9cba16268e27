from __future__ import annotations

from pdserve.config import CacheConfig
from pdserve.kv.block_pool import Allocated, OutOfBlocks
from pdserve.kv.manager import KVManager, SwapPlan
from pdserve.requests import Request

B = 4


def manager(num_blocks: int = 16, num_host_blocks: int = 8, prefix_cache: bool = True) -> KVManager:
    return KVManager(CacheConfig(B, num_blocks, num_host_blocks, 0.0, prefix_cache))


def computed(kv: KVManager, rid: str, tokens: list[int]) -> Request:
    """A request whose whole prompt went through the model."""
    r = Request(rid, list(tokens))
    result = kv.admit(r, kv.match(r), len(tokens))
    assert isinstance(result, Allocated)
    r.num_computed_tokens = len(tokens)
    kv.cache_computed(r)
    return r


def test_allocate_slots_covers_computed_plus_new_and_charges_growth() -> None:
    kv = manager()
    r = computed(kv, "a", list(range(8)))
    assert len(kv.block_table("a")) == 2
    assert kv.allocate_slots(r, 1) == Allocated(kv.block_table("a"))  # token 8 needs block 3
    assert len(kv.block_table("a")) == 3
    kv.check_integrity()


def test_free_keeps_full_computed_blocks_in_the_prefix_cache() -> None:
    kv = manager()
    r = computed(kv, "a", list(range(10)))
    kv.free(r)
    stats = kv.stats()
    assert (stats.active, stats.cached, stats.free) == (0, 2, 14)
    kv.check_integrity()


def test_match_leaves_the_last_prompt_token_to_compute() -> None:
    kv = manager()
    kv.free(computed(kv, "a", list(range(8))))
    again = Request("b", list(range(8)))
    assert kv.match(again).num_tokens == 4  # not 8: token 7 must produce logits


def test_equal_blocks_computed_twice_are_deduplicated() -> None:
    kv = manager()
    tokens = list(range(8))
    a, b = Request("a", tokens), Request("b", tokens)
    kv.admit(a, kv.match(a), 8)
    kv.admit(b, kv.match(b), 8)
    for r in (a, b):
        r.num_computed_tokens = 8
        kv.cache_computed(r)
    assert kv.block_table("a") == kv.block_table("b")
    assert kv.stats().active == 2
    kv.check_integrity()


def test_allocation_evicts_cached_blocks_and_respects_the_reserve() -> None:
    kv = manager(num_blocks=4)
    kv.free(computed(kv, "a", list(range(16))))
    assert kv.stats().cached == 4
    r = Request("b", [9] * 12)
    assert isinstance(kv.admit(r, kv.match(r), 12, reserve=2), OutOfBlocks)
    assert kv.stats().cached == 4  # a refused admission changes nothing
    assert isinstance(kv.admit(r, kv.match(r), 12, reserve=1), Allocated)
    assert kv.stats().cached == 1
    kv.check_integrity()


def test_swap_out_and_in_round_trip() -> None:
    kv = manager(prefix_cache=False)
    r = computed(kv, "a", list(range(10)))
    table = kv.block_table("a")
    out = kv.swap_out(r)
    assert isinstance(out, SwapPlan) and [d for d, _ in out.pairs] == list(table)
    assert kv.stats().swapped == 3 and kv.stats().active == 0
    back = kv.swap_in(r)
    assert isinstance(back, SwapPlan)
    assert [h for h, _ in back.pairs] == [h for _, h in out.pairs]
    assert kv.stats().swapped == 3  # host blocks wait for the step to run
    kv.end_step()
    assert kv.stats().swapped == 0 and len(kv.block_table("a")) == 3
    kv.check_integrity()


def test_swap_in_reuses_blocks_still_in_the_prefix_cache() -> None:
    kv = manager()
    r = computed(kv, "a", list(range(10)))
    kv.swap_out(r)
    back = kv.swap_in(r)
    assert isinstance(back, SwapPlan) and len(back.pairs) == 1  # only the partial block is copied
    kv.end_step()
    kv.check_integrity()


def test_swap_out_without_host_room_is_refused() -> None:
    kv = manager(num_host_blocks=2)
    r = computed(kv, "a", list(range(12)))
    assert isinstance(kv.swap_out(r), OutOfBlocks)
    assert len(kv.block_table("a")) == 3


def test_hold_outlives_free_until_released() -> None:
    kv = manager(prefix_cache=False)
    r = computed(kv, "a", list(range(8)))
    hold = kv.hold(r)
    kv.free(r)
    assert kv.stats().active == 2
    kv.check_integrity()
    kv.release(hold)
    kv.release(hold)  # idempotent
    assert kv.stats().active == 0 and kv.stats().free == 16
    kv.check_integrity()


def test_reserve_shares_the_cached_prompt_prefix_and_allocates_the_rest() -> None:
    kv = manager()
    kv.free(computed(kv, "a", list(range(8))))
    r = Request("b", list(range(8)) + [5])
    match = kv.match_prompt(r)
    assert match.num_tokens == 8 and len(match.blocks) == 2
    result = kv.reserve(r, match)
    assert isinstance(result, Allocated) and len(result.blocks) == 3 and result.blocks[:2] == tuple(match.blocks)
    assert kv.stats().cached == 0  # both cached blocks are in use again
    kv.free(r)
    kv.check_integrity()


def test_reserve_never_matches_the_prompts_last_token() -> None:
    kv = manager()
    kv.free(computed(kv, "a", list(range(8))))
    match = kv.match_prompt(Request("b", list(range(8))))
    assert match.num_tokens == 4  # the last block holds the last token: the prefill worker sends it
