import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdserve.transfer.descriptors import (
    BlockRun,
    ByteRange,
    check_bounds,
    dst_block_ids,
    dst_range,
    join_runs,
    merge_runs,
    plan_messages,
    runs_digest,
    split_runs,
    src_range,
)


def test_consecutive_pairs_merge_into_runs_in_order():
    pairs = [(4, 10), (5, 11), (6, 12), (9, 13), (10, 14), (0, 20)]
    assert merge_runs(pairs) == (BlockRun(4, 10, 3), BlockRun(9, 13, 2), BlockRun(0, 20, 1))


def test_a_break_on_either_side_ends_the_run():
    assert merge_runs([(0, 0), (1, 5), (2, 6)]) == (BlockRun(0, 0, 1), BlockRun(1, 5, 2))
    assert merge_runs([(0, 0), (7, 1)]) == (BlockRun(0, 0, 1), BlockRun(7, 1, 1))


def test_contiguous_pairs_make_one_descriptor_not_one_per_block():
    pairs = [(100 + i, 7 + i) for i in range(256)]
    assert merge_runs(pairs) == (BlockRun(100, 7, 256),)


def test_byte_ranges_of_a_run():
    run = BlockRun(4, 10, 3)
    assert src_range(run, 1000) == ByteRange(4000, 3000)
    assert dst_range(run, 1000) == ByteRange(10000, 3000)


def test_duplicate_destination_and_negative_ids_are_refused():
    with pytest.raises(ValueError):
        merge_runs([(0, 3), (1, 3)])
    with pytest.raises(ValueError):
        merge_runs([(-1, 3)])
    assert merge_runs([(2, 0), (2, 5)]) == (BlockRun(2, 0, 1), BlockRun(2, 5, 1))


def test_split_caps_messages_and_join_undoes_it():
    runs = (BlockRun(0, 100, 10), BlockRun(50, 3, 2))
    pieces = split_runs(runs, 4)
    assert pieces == (BlockRun(0, 100, 4), BlockRun(4, 104, 4), BlockRun(8, 108, 2), BlockRun(50, 3, 2))
    assert join_runs(pieces) == runs


def test_plan_never_cuts_below_one_block():
    assert plan_messages([(0, 0), (1, 1)], block_nbytes=1000, max_message_bytes=10) == (
        BlockRun(0, 0, 1),
        BlockRun(1, 1, 1),
    )


def test_bounds():
    check_bounds((BlockRun(0, 28, 4),), 32, "dst")
    with pytest.raises(ValueError):
        check_bounds((BlockRun(0, 29, 4),), 32, "dst")
    with pytest.raises(ValueError):
        check_bounds((BlockRun(30, 0, 4),), 32, "src")


def test_digest_names_layout_and_block_size():
    runs = merge_runs([(0, 1), (1, 2)])
    assert runs_digest(runs, 64) == runs_digest(merge_runs([(0, 1), (1, 2)]), 64)
    assert runs_digest(runs, 64) != runs_digest(runs, 128)
    assert runs_digest(runs, 64) != runs_digest(split_runs(runs, 1), 64)


pair_lists = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=60, unique_by=lambda p: p[1]
)


@settings(max_examples=200, deadline=None)
@given(pair_lists, st.integers(1, 8))
def test_runs_cover_exactly_the_pairs_in_order_and_are_maximal(pairs, max_blocks):
    runs = merge_runs(pairs)
    expanded = [(s, d) for r in runs for s, d in zip(r.src_blocks(), r.dst_blocks())]
    assert expanded == list(pairs)
    assert all(not (b.src_start == a.src_start + a.count and b.dst_start == a.dst_start + a.count)
               for a, b in zip(runs, runs[1:]))
    assert dst_block_ids(runs) == tuple(d for _, d in pairs)
    pieces = split_runs(runs, max_blocks)
    assert all(p.count <= max_blocks for p in pieces)
    assert join_runs(pieces) == runs
    assert merge_runs(list(pairs)) == runs
