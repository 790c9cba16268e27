"""`auto` by measurement: the probe times every layout it is given, and the choice from its rates
never multiplies a row count with a layout the probe saw slower than another there."""

from __future__ import annotations

import pytest
import torch

from pdserve.cpu.product_probe import ProductRates, dense, probe_products, shape_counts
from pdserve.model.row_route import DENSE as D
from pdserve.model.row_route import PACKED as K
from pdserve.model.row_route import PANELS as P
from pdserve.model.row_route import RowRoute
from pdserve.cpu.weight_layout import PANELS, WeightLayout, fastest_layout, with_head_route

ROWS = (1, 4, 16, 64, 256, 512)


def rates(**seconds: tuple[float, ...]) -> ProductRates:
    return ProductRates(ROWS, seconds)


def test_each_range_of_rows_reads_the_weight_fastest_there():
    measured = rates(dense=(1, 2, 3, 4, 10, 20), panels=(0.5, 1, 2, 5, 12, 30), onednn=(2, 3, 4, 3, 8, 15))
    layout = fastest_layout(measured)
    assert layout == WeightLayout("onednn", PANELS, RowRoute((1, 4, 16, 64, 256), (P, P, P, K, K, K)))
    assert str(layout) == "panels up to 16 rows, onednn beyond"
    assert layout.rates is None  # choose_weight_layout attaches the rates it chose by


def test_dense_serves_the_ranges_where_neither_copy_was_faster():
    measured = rates(dense=(1, 2, 3, 4, 10, 20), panels=(0.5, 3, 4, 5, 12, 30), mkl=(2, 1, 4, 5, 8, 15))
    layout = fastest_layout(measured)
    assert [layout.route.kind(r) for r in (1, 2, 4, 5, 16, 64, 65, 256, 10_000)] == [P, K, K, D, D, D, K, K, K]
    assert str(layout) == "panels up to 1 rows, mkl up to 4, dense up to 64, mkl beyond"


def test_panels_never_fastest_are_kept_for_the_fused_step_only():
    measured = rates(dense=(1, 2, 3, 4, 10, 20), panels=(2, 3, 4, 5, 11, 21))
    assert fastest_layout(measured) == WeightLayout("dense", PANELS, RowRoute((1, 4, 16, 64, 256), (D,) * 6))
    assert str(fastest_layout(measured)) == "dense, panels for fused decode steps only"


def test_a_packing_that_never_beats_dense_is_not_kept_and_one_packing_is_kept_at_most():
    assert fastest_layout(rates(dense=(1, 2, 3, 4, 10, 20), onednn=(2, 3, 4, 5, 11, 21))).many_rows == "dense"
    both = fastest_layout(rates(dense=(9,) * 6, onednn=(1, 1, 1, 1, 9, 9), mkl=(2, 2, 2, 2, 2, 2)))
    assert both.many_rows == "mkl" and both.route.kinds == (D, K, K, K, K, K)  # one row: a packing computes >= 2


def test_the_head_takes_its_own_route_among_the_copies_it_holds():
    layers = fastest_layout(rates(dense=(1, 2, 3, 4, 10, 20), panels=(0.5, 1, 2, 5, 12, 30), mkl=(2, 3, 4, 3, 8, 15)))
    head = ProductRates(ROWS[:5], {"dense": (1, 4, 9, 30, 90), "panels": (1, 3, 6, 20, 70), "mkl": (2, 3, 7, 25, 60)})
    layout = with_head_route(layers, head)
    assert layout.route == layers.route and layout.head_rates is head
    assert [layout.head_route.kind(r) for r in (1, 2, 4, 16, 64, 65, 256, 1000)] == [D, P, P, P, P, K, K, K]
    assert str(layout) == "panels up to 16 rows, mkl beyond; the head: dense up to 1 rows, panels up to 64, mkl beyond"


def test_the_head_reads_no_packing_the_layers_do_not_hold():
    layers = fastest_layout(rates(dense=(1, 2, 3, 4, 10, 20), panels=(0.5, 1, 2, 5, 12, 30)))
    head = ProductRates(ROWS[:2], {"dense": (1, 4), "panels": (2, 3), "mkl": (0.1, 0.1)})
    assert with_head_route(layers, head).head_route == RowRoute((1,), (D, P))


def test_the_explicit_layouts_read_as_before():
    assert str(WeightLayout("onednn", PANELS)) == "panels up to 256 rows, onednn beyond"
    assert str(WeightLayout("dense", PANELS)) == "panels up to 256 rows, dense beyond"
    assert str(WeightLayout("mkl")) == "mkl" and str(WeightLayout("dense")) == "dense"
    with pytest.raises(ValueError):
        RowRoute((4, 2), (P, K, D))


def test_the_probe_times_every_layout_at_every_row_count_and_round_trips():
    shapes = shape_counts([torch.zeros(8, 12), torch.zeros(8, 12), torch.zeros(12, 8)])
    assert shapes == {(8, 12): 2, (12, 8): 1}
    probed = probe_products(shapes, {"dense": dense, "twice": lambda w: dense(torch.cat([w, w], 1))}, rows=(1, 3))
    assert probed.rows == (1, 3) and set(probed.seconds) == {"dense", "twice"}
    assert all(len(s) == 2 and all(t > 0 for t in s) for s in probed.seconds.values())
    assert ProductRates.from_json(probed.to_json()) == probed
    assert probed.fastest(2) in probed.seconds and probed.fastest(1000) in probed.seconds
