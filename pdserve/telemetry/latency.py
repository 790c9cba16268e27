"""Token timing of one request: time to first token (TTFT), time between tokens (TBT).

    timeline = TokenTimeline(arrival=time.monotonic())
    timeline.record(time.monotonic())              # each message of the stream
    timeline.finish(time.monotonic())
    span.set_attributes(timeline.span_attributes())  # pdserve.ttft, pdserve.tbt.p50, ...

All times are seconds from one monotonic clock. A delivery that carries several tokens at
once (`record(now, num_tokens=3)`) counts as one arrival: TBT is the gap between deliveries,
what a streaming client sees. Percentiles come from `pdserve/stats.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from pdserve.stats import Distribution
from pdserve.stats import Distribution as Percentiles  # noqa: F401  (pdserve.telemetry's public name)
from pdserve.stats import distribution
from pdserve.stats import distribution as summarize  # noqa: F401  (pdserve.telemetry's public name)
from pdserve.stats import percentile  # noqa: F401  (benchmarks/scheduler_overhead.py imports it from here)


class TimelineSummary(NamedTuple):
    tokens: int
    ttft: float | None
    e2e: float | None
    tbt: Distribution | None


@dataclass
class TokenTimeline:
    """Arrival times of one request's tokens, from the request's arrival onwards."""

    arrival: float
    deliveries: list[float] = field(default_factory=list)  # one time per delivery, ascending
    num_tokens: int = 0
    finished_at: float | None = None

    def record(self, now: float, num_tokens: int = 1) -> None:
        """Note that `num_tokens` (>= 1) tokens arrived together at `now`."""
        if num_tokens < 1:
            raise ValueError(f"a delivery carries at least one token, got {num_tokens}")
        if now < (self.deliveries[-1] if self.deliveries else self.arrival):
            raise ValueError("token times must not go backwards")
        self.deliveries.append(now)
        self.num_tokens += num_tokens

    def finish(self, now: float) -> None:
        self.finished_at = now

    @property
    def last(self) -> float:
        """The last delivery's time (the arrival's before any)."""
        return self.deliveries[-1] if self.deliveries else self.arrival

    @property
    def ttft(self) -> float | None:
        return self.deliveries[0] - self.arrival if self.deliveries else None

    @property
    def e2e(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.arrival

    def inter_token_latencies(self) -> list[float]:
        return [b - a for a, b in zip(self.deliveries, self.deliveries[1:])]

    def summary(self) -> TimelineSummary:
        return TimelineSummary(
            tokens=self.num_tokens,
            ttft=self.ttft,
            e2e=self.e2e,
            tbt=distribution(self.inter_token_latencies()),
        )

    def span_attributes(self, prefix: str = "pdserve") -> dict[str, float | int]:
        """Span attributes in seconds: `{prefix}.tokens`, `.ttft`, `.e2e`, `.tbt.p50`, `.tbt.p99`,
        `.tbt.max`, `.tbt.mean`; the timing ones only once known."""
        summary = self.summary()
        attributes: dict[str, float | int] = {f"{prefix}.tokens": summary.tokens}
        for name, value in (("ttft", summary.ttft), ("e2e", summary.e2e)):
            if value is not None:
                attributes[f"{prefix}.{name}"] = value
        if summary.tbt is not None:
            for name in ("p50", "p99", "max", "mean"):
                attributes[f"{prefix}.tbt.{name}"] = getattr(summary.tbt, name)
        return attributes
