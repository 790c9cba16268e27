"""Statistics on synthetic records: percentiles, TBT from timestamps, goodput, failures, groups."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdserve.bench.records import NOT_SENT, OK, UNFINISHED, RequestRecord
from pdserve.bench.stats import meets_slo, summarize, summarize_run
from pdserve.stats import Slo, distribution, percentile


def record(index=0, sent=0.0, times=(), counts=None, status=OK, kind="chat", priority="normal", done=None,
           preemptions=0, cached=0) -> RequestRecord:
    times = list(times)
    return RequestRecord(index, kind, priority, 16, sent_s=sent, token_times=times,
                         token_counts=list(counts) if counts else [1] * len(times),
                         done_s=done if done is not None else (times[-1] if times else sent), status=status,
                         preemptions=preemptions, cached_tokens=cached)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.sampled_from([0, 1, 50, 90, 99, 100]))
def test_percentile_matches_numpy_linear(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


def test_percentile_and_distribution_of_nothing_are_none():
    assert percentile([], 50) is None
    assert distribution([]) is None


def test_ttft_gaps_latency_from_timestamps():
    r = record(sent=1.0, times=[1.5, 1.7, 2.2, 2.3], counts=[1, 2, 1, 1], done=2.4)
    assert r.ttft_s == pytest.approx(0.5)
    assert r.gaps_s == pytest.approx([0.2, 0.5, 0.1])
    assert r.latency_s == pytest.approx(1.4)
    assert r.output_tokens == 5


def test_a_request_without_tokens_has_no_ttft():
    assert record(times=[], status="UNAVAILABLE").ttft_s is None
    assert RequestRecord(0, "chat", "vip", 8).latency_s is None


def test_goodput_needs_ok_and_both_slos():
    slo = Slo(ttft_s=1.0, tbt_s=0.3)
    fine = record(times=[0.5, 0.7, 0.9])
    slow_start = record(times=[1.5, 1.6])
    stalled = record(times=[0.2, 0.3] + [0.4 + 0.1 * i for i in range(5)] + [2.0])
    failed = record(times=[0.2, 0.3], status="INTERNAL")
    single = record(times=[0.9])
    assert [meets_slo(r, slo) for r in (fine, slow_start, stalled, failed, single)] == [True, False, False, False,
                                                                                        True]


def test_group_summary_pools_gaps_and_counts_failures():
    records = [record(0, 0.0, [1.0, 1.1, 1.3], preemptions=2, cached=32),
               record(1, 0.5, [2.0, 2.4], priority="vip"),
               record(2, 1.0, [], status="RESOURCE_EXHAUSTED"),
               record(3, 1.0, [3.0], status=UNFINISHED),
               RequestRecord(4, "chat", "normal", 16)]
    g = summarize("all", records, duration_s=4.0, slo=Slo(ttft_s=1.2, tbt_s=0.5))
    assert g.requests == 5 and g.completed == 2
    assert g.failed == {NOT_SENT: 1, "RESOURCE_EXHAUSTED": 1, UNFINISHED: 1}
    assert g.tbt.count == 3 and g.tbt.max == pytest.approx(0.4)
    assert g.ttft.count == 3 and g.ttft.max == pytest.approx(2.0)
    assert g.output_tokens == 5 and g.output_tokens_per_s == pytest.approx(1.25)
    assert g.goodput == 1 and g.goodput_per_s == pytest.approx(0.25)
    assert g.preemptions == 2 and g.preempted_requests == 1 and g.cached_tokens == 32
    assert g.latency.count == 2


def test_run_summary_has_all_then_classes_then_kinds():
    records = [record(0, times=[1.0]), record(1, times=[1.0], priority="vip"),
               record(2, times=[5.0, 6.0], priority="batch", kind="document")]
    groups = summarize_run(records, 6.0, Slo())
    assert [g.name for g in groups] == ["all", "vip", "normal", "batch", "kind:chat", "kind:document"]
    by = {g.name: g for g in groups}
    assert by["kind:document"].ttft.p50 == pytest.approx(5.0)
    assert sum(by[p].output_tokens_per_s for p in ("vip", "normal", "batch")) == pytest.approx(
        by["all"].output_tokens_per_s)
