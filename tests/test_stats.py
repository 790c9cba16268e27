"""pdserve.stats: percentiles like numpy's linear default, distributions, the SLO check, and
the one behaviour on empty input (None)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdserve.stats import Distribution, Slo, distribution, percentile

samples = st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=60)


@given(samples, st.floats(0, 100))
def test_percentile_matches_numpy_in_any_order(values, q):
    expected = float(np.percentile(values, q))
    assert percentile(values, q) == pytest.approx(expected, rel=1e-9, abs=1e-6)
    assert percentile(reversed(values), q) == percentile(values, q)


@given(samples)
def test_distribution_is_ordered_and_bounded(values):
    d = distribution(values)
    assert d.count == len(values)
    assert min(values) <= d.p50 <= d.p90 <= d.p99 <= d.max == max(values)
    assert min(values) - 1e-6 <= d.mean <= max(values) + 1e-6


def test_no_samples_is_none_everywhere():
    assert percentile([], 50) is None
    assert percentile(iter(()), 99) is None
    assert distribution([]) is None
    assert distribution(x for x in ()) is None


def test_one_sample_is_every_percentile():
    assert distribution([7.0]) == Distribution(1, 7.0, 7.0, 7.0, 7.0, 7.0)


def test_interpolates_between_ranks():
    values = [4.0, 1.0, 3.0, 2.0]
    assert [percentile(values, q) for q in (0, 50, 100)] == [1.0, 2.5, 4.0]


def test_slo_needs_a_first_token_in_time_and_p99_tbt_within():
    slo = Slo(ttft_s=1.0, tbt_s=0.1)
    assert slo.met_by(0.5, [0.05] * 200)
    assert slo.met_by(1.0, [])  # one token: no gaps, nothing to miss
    assert not slo.met_by(None, [])
    assert not slo.met_by(1.01, [0.05])
    assert not slo.met_by(0.5, [0.05] * 10 + [0.5])
    assert slo.met_by(0.5, [0.05] * 199 + [5.0])  # one stall in 200 gaps is under the p99


def test_slo_defaults():
    assert (Slo().ttft_s, Slo().tbt_s) == (5.0, 1.0)
