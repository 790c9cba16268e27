"""What the runner saw of one request: when it was sent, when each streamed message arrived, how it ended."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pdserve.bench.workloads import BenchRequest

OK = "OK"
UNFINISHED = "UNFINISHED"  # still streaming when the run's time limit came
NOT_SENT = "NOT_SENT"  # its arrival time lay beyond the run's time limit


@dataclass
class RequestRecord:
    """Filled in by the runner as messages arrive; times are seconds since the run started.

    `token_times[i]` is when the i-th message carrying tokens arrived and `token_counts[i]` how
    many tokens it carried; `token_ids` are all of them in order. `status` is OK, a gRPC status code name, UNFINISHED or NOT_SENT."""

    index: int
    kind: str
    priority: str
    max_tokens: int
    sent_s: float | None = None
    token_times: list[float] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    done_s: float | None = None
    status: str = NOT_SENT
    detail: str = ""
    request_id: str = ""  # as the server named it in its first message
    finish_reason: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    preemptions: int = 0

    @classmethod
    def of(cls, request: BenchRequest) -> RequestRecord:
        return cls(request.index, request.kind.value, request.priority.name.lower(), request.max_tokens)

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def ttft_s(self) -> float | None:
        if self.sent_s is None or not self.token_times:
            return None
        return self.token_times[0] - self.sent_s

    @property
    def gaps_s(self) -> list[float]:
        """Time between consecutive messages that carried tokens (the TBT samples)."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def latency_s(self) -> float | None:
        if self.sent_s is None or self.done_s is None:
            return None
        return self.done_s - self.sent_s

    @property
    def output_tokens(self) -> int:
        return sum(self.token_counts)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RequestRecord:
        return cls(**data)
