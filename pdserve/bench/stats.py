"""Distributions, throughput and goodput of a run, per priority class, per kind and overall.

TTFT is first token message minus send time; TBT samples are the gaps between consecutive
messages that carried tokens (pooled over the group's requests); latency is send to last
message. A request meets the SLOs (counts towards goodput) when it finished OK, its TTFT is at
most `ttft_s` and its own P99 TBT is at most `tbt_s`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.bench.records import RequestRecord
from pdserve.telemetry.latency import percentile as sorted_percentile


@dataclass(frozen=True)
class Slo:
    ttft_s: float = 5.0
    tbt_s: float = 1.0


@dataclass(frozen=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float


@dataclass(frozen=True)
class GroupSummary:
    """One group of requests (a priority class, a kind, or all). Distributions are None without samples."""

    name: str
    requests: int
    completed: int
    failed: dict[str, int]  # status -> count, OK excluded
    ttft: Distribution | None
    tbt: Distribution | None
    latency: Distribution | None
    output_tokens: int
    output_tokens_per_s: float
    goodput: int
    goodput_per_s: float
    preemptions: int
    preempted_requests: int
    cached_tokens: int


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); values must not be empty."""
    return sorted_percentile(sorted(values), q)


def distribution(values: Sequence[float]) -> Distribution | None:
    if not values:
        return None
    return Distribution(len(values), sum(values) / len(values), percentile(values, 50), percentile(values, 90),
                        percentile(values, 99), max(values))


def meets_slo(record: RequestRecord, slo: Slo) -> bool:
    ttft = record.ttft_s
    if not record.ok or ttft is None or ttft > slo.ttft_s:
        return False
    gaps = record.gaps_s
    return not gaps or percentile(gaps, 99) <= slo.tbt_s


def summarize(name: str, records: Sequence[RequestRecord], duration_s: float, slo: Slo) -> GroupSummary:
    """`duration_s` is the whole run's, so per-second figures of groups add up to the total."""
    ok = [r for r in records if r.ok]
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    good = sum(meets_slo(r, slo) for r in records)
    tokens = sum(r.output_tokens for r in ok)
    return GroupSummary(
        name=name, requests=len(records), completed=len(ok),
        failed=dict(sorted(Counter(r.status for r in records if not r.ok).items())),
        ttft=distribution([r.ttft_s for r in records if r.ttft_s is not None]),
        tbt=distribution([g for r in records for g in r.gaps_s]),
        latency=distribution([r.latency_s for r in ok if r.latency_s is not None]),
        output_tokens=tokens, output_tokens_per_s=tokens * per_s, goodput=good, goodput_per_s=good * per_s,
        preemptions=sum(r.preemptions for r in records), preempted_requests=sum(r.preemptions > 0 for r in records),
        cached_tokens=sum(r.cached_tokens for r in records))


def summarize_run(records: Sequence[RequestRecord], duration_s: float, slo: Slo) -> tuple[GroupSummary, ...]:
    """`all`, then each priority class present (vip, normal, batch), then each kind present."""
    groups = [summarize("all", records, duration_s, slo)]
    for priority in ("vip", "normal", "batch"):
        members = [r for r in records if r.priority == priority]
        if members:
            groups.append(summarize(priority, members, duration_s, slo))
    for kind in sorted({r.kind for r in records}):
        groups.append(summarize(f"kind:{kind}", [r for r in records if r.kind == kind], duration_s, slo))
    return tuple(groups)
