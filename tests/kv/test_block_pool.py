from __future__ import annotations

import pytest

from pdserve.kv.block_pool import Allocated, BlockPool, BlockState, BlockStateError, OutOfBlocks


def test_allocate_returns_typed_results_and_never_partial() -> None:
    pool = BlockPool(4)
    assert pool.allocate(3) == Allocated((0, 1, 2))
    assert pool.allocate(2) == OutOfBlocks(needed=2, available=1)
    assert pool.num_free == 1 and pool.num_active == 3
    pool.check_integrity()


def test_states_free_active_cached() -> None:
    pool = BlockPool(3)
    (a, b) = pool.allocate(2).blocks
    pool.mark_cached(a)
    pool.decref(a)
    pool.decref(b)
    assert pool.state(a) == BlockState.CACHED and pool.state(b) == BlockState.FREE
    assert (pool.num_free, pool.num_cached, pool.num_active) == (2, 1, 0)
    pool.incref(a)  # a prefix hit revives a cached block
    assert pool.state(a) == BlockState.ACTIVE and pool.num_cached == 0
    pool.decref(a)
    pool.evict(a)
    assert pool.state(a) == BlockState.FREE and pool.num_free == 3
    pool.check_integrity()


def test_double_free_and_incref_of_free_block_raise() -> None:
    pool = BlockPool(2)
    (a,) = pool.allocate(1).blocks
    pool.decref(a)
    with pytest.raises(BlockStateError):
        pool.decref(a)
    with pytest.raises(BlockStateError):
        pool.incref(a)


def test_shared_block_returns_only_after_last_reference() -> None:
    pool = BlockPool(2)
    (a,) = pool.allocate(1).blocks
    pool.incref(a)
    pool.decref(a)
    assert pool.state(a) == BlockState.ACTIVE
    pool.decref(a)
    assert pool.state(a) == BlockState.FREE


def test_evicting_a_referenced_block_is_refused() -> None:
    pool = BlockPool(2)
    (a,) = pool.allocate(1).blocks
    pool.mark_cached(a)
    with pytest.raises(BlockStateError):
        pool.evict(a)
    with pytest.raises(BlockStateError):
        pool.mark_cached(a)
