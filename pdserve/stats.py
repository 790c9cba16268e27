"""Percentiles, distributions and SLO checks: the one place pdserve computes them.

    distribution([0.1, 0.3, 0.2])   # Distribution(count=3, mean=0.2, p50=0.2, p90=0.28, p99=0.298, max=0.3)
    distribution([])                # None: no samples
    percentile([4.0, 1.0, 2.0], 50) # 2.0 (values in any order; linear, numpy's default)
    percentile([], 50)              # None: no samples
    Slo(ttft_s=1.0, tbt_s=0.1).met_by(ttft_s=0.4, gaps_s=[0.05, 0.2])   # False: p99 TBT over 0.1

Live telemetry (`pdserve/telemetry/latency.py`: a stream's TBT on its span), measured runs
(`pdserve/bench/`) and simulated runs (`pdserve/sim/`) all summarise latencies the same way, so
the module belongs to none of them: it sits at the top of the package beside `config.py` and
`requests.py`, below all three, and imports nothing of pdserve.

NOTE: empty input has one behaviour everywhere: `None` ("no samples"), never NaN and never an
exception. The result types say so (`float | None`, `Distribution | None`), so a caller cannot
forget the case; tables print it as "-".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Distribution:
    """Count, mean, p50/p90/p99 and max of a non-empty set of samples."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float


@dataclass(frozen=True)
class Slo:
    """A request meets it when its TTFT is at most `ttft_s` and its own p99 TBT at most `tbt_s`."""

    ttft_s: float = 5.0
    tbt_s: float = 1.0

    def met_by(self, ttft_s: float | None, gaps_s: Sequence[float]) -> bool:
        """`ttft_s` None (no first token) never meets it; no gaps (one token) meet the TBT."""
        if ttft_s is None or ttft_s > self.ttft_s:
            return False
        p99 = percentile(gaps_s, 99)
        return p99 is None or p99 <= self.tbt_s


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0..100) of `values` (any order), linearly interpolated between the
    closest ranks (numpy's default); None for no values."""
    ordered = sorted(values)
    return _sorted_percentile(ordered, q) if ordered else None


def median(values: Iterable[float]) -> float:
    """The 50th percentile of `values`, which must not be empty (ValueError)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("the median of no values")
    return _sorted_percentile(ordered, 50)


def distribution(values: Iterable[float]) -> Distribution | None:
    """The distribution of `values`; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    p50, p90, p99 = (_sorted_percentile(ordered, q) for q in (50, 90, 99))
    return Distribution(len(ordered), sum(ordered) / len(ordered), p50, p90, p99, ordered[-1])


def _sorted_percentile(ordered: Sequence[float], q: float) -> float:
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    below, above = ordered[low], ordered[high]
    return min(above, below + (above - below) * (rank - low))
