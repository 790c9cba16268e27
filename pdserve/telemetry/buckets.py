"""Histogram bucket bounds of the metrics (pdserve/telemetry/metrics.py), and many values observed at once."""

from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence

LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # seconds: TTFT, end-to-end, queue time
TOKEN_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # seconds between tokens of one stream
TRANSFER_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # seconds per KV transfer
RATIO_BUCKETS = (0.1, 0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0, 10.0)  # measured / predicted


def observe_all(histogram, values: Sequence[float]) -> None:
    """Each of `values` observed in `histogram` (a family's child, its labels applied) as its
    `observe` would one by one, each bucket's count added once. NOTE: reads prometheus_client's
    Histogram internals (`_upper_bounds`, `_buckets`, `_sum`); where they differ, one by one."""
    bounds, buckets, total = (getattr(histogram, name, None) for name in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for value in values:
            histogram.observe(value)
        return
    histogram._raise_if_not_observable()
    for index, count in Counter(bisect_left(bounds, value) for value in values).items():
        buckets[index].inc(count)
    total.inc(sum(values))
