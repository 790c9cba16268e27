"""Distributions, throughput and goodput of a run, per priority class, per kind and overall.

TTFT is first token message minus send time; TBT samples are the gaps between consecutive
messages that carried tokens (pooled over the group's requests); latency is send to last
message. A request meets the SLOs (counts towards goodput) when it finished OK, its TTFT is at
most `ttft_s` and its own P99 TBT is at most `tbt_s` (`Slo` and the distributions: pdserve/stats.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.bench.records import RequestRecord
from pdserve.stats import Distribution, Slo, distribution


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


def meets_slo(record: RequestRecord, slo: Slo) -> bool:
    return record.ok and slo.met_by(record.ttft_s, record.gaps_s)


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
