import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdserve.stats import distribution as summarize
from pdserve.stats import percentile
from pdserve.telemetry.latency import TokenTimeline


def test_empty_timeline():
    timeline = TokenTimeline(arrival=1.0)
    assert (timeline.ttft, timeline.e2e, timeline.inter_token_latencies()) == (None, None, [])
    assert timeline.summary().tbt is None
    assert timeline.span_attributes() == {"pdserve.tokens": 0}


def test_ttft_tbt_and_e2e():
    timeline = TokenTimeline(arrival=100.0)
    timeline.record(100.25)
    timeline.record(100.30, num_tokens=2)
    timeline.record(100.40)
    timeline.finish(100.5)
    assert timeline.ttft == pytest.approx(0.25)
    assert timeline.inter_token_latencies() == pytest.approx([0.05, 0.10])
    assert timeline.e2e == pytest.approx(0.5)
    summary = timeline.summary()
    assert summary.tokens == 4
    assert summary.tbt.count == 2
    assert summary.tbt.p50 == pytest.approx(0.075)
    assert summary.tbt.max == pytest.approx(0.10)


def test_span_attributes_names_and_values():
    timeline = TokenTimeline(arrival=0.0)
    for now in (0.2, 0.21, 0.23, 0.26):
        timeline.record(now)
    attributes = timeline.span_attributes()
    assert set(attributes) == {
        "pdserve.tokens", "pdserve.ttft", "pdserve.tbt.p50", "pdserve.tbt.p99",
        "pdserve.tbt.max", "pdserve.tbt.mean",
    }
    assert attributes["pdserve.tokens"] == 4
    assert attributes["pdserve.tbt.p50"] == pytest.approx(0.02)
    assert attributes["pdserve.tbt.max"] == pytest.approx(0.03)
    assert all(isinstance(v, (int, float)) for v in attributes.values())


def test_bad_records_are_refused():
    timeline = TokenTimeline(arrival=5.0)
    with pytest.raises(ValueError):
        timeline.record(4.0)
    with pytest.raises(ValueError):
        timeline.record(6.0, num_tokens=0)


def test_percentile_interpolates():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    assert summarize([]) is None


@given(st.lists(st.floats(min_value=0, max_value=1e3), min_size=1, max_size=200))
def test_summary_is_ordered_and_bounded(values):
    s = summarize(values)
    assert min(values) <= s.p50 <= s.p90 <= s.p99 <= s.max == max(values)
    assert s.count == len(values)
    assert min(values) - 1e-9 <= s.mean <= max(values) + 1e-9
