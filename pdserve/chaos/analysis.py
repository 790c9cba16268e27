"""What a faulted run did against the no-fault run of the same requests.

    lost       a request that ended with an error status, never finished, or has fewer tokens
               than asked for (every request ignores EOS)
    differ     a request complete in both runs whose token ids are not equal (greedy and
               seeded sampling counted apart); pdserve.chaos.ties judges each a near-tie or real
    TBT split  a chat token gap is `during` a fault when [gap start, gap end] meets
               [fault start, fault end + settle_s]; every other gap is `outside`
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.bench.records import RequestRecord
from pdserve.bench.workloads import Workload
from pdserve.chaos.load import is_sampled
from pdserve.stats import Distribution, distribution


@dataclass(frozen=True)
class Loss:
    index: int
    kind: str
    status: str
    detail: str
    tokens: int
    max_tokens: int
    request_id: str  # the router's, to find the request in its logs


@dataclass(frozen=True)
class Difference:
    index: int
    sampled: bool
    first_index: int  # the first token position where the outputs part
    request_id: str  # the faulted run's, as the router named it
    tokens: tuple[int, int] | None  # (no-fault run's, faulted run's) at first_index; None: one output ends there
    prefix: tuple[int, ...]  # the tokens both runs share, before first_index


@dataclass(frozen=True)
class Comparison:
    """Every difference, near-ties included (the verdict counts the tie judge's calls apart)."""

    greedy_compared: int
    seeded_compared: int
    differences: tuple[Difference, ...]

    @property
    def greedy_differ(self) -> int:
        return sum(not d.sampled for d in self.differences)

    @property
    def seeded_differ(self) -> int:
        return sum(d.sampled for d in self.differences)


@dataclass(frozen=True)
class Window:
    start_s: float  # seconds after the run started
    end_s: float


@dataclass(frozen=True)
class TbtSplit:
    during: Distribution | None
    outside: Distribution | None
    by_priority: tuple[tuple[str, TbtSplit], ...] = ()  # (vip | normal | batch, its split), those present


def complete(record: RequestRecord) -> bool:
    return record.ok and record.output_tokens >= record.max_tokens


def losses(records: Sequence[RequestRecord]) -> tuple[Loss, ...]:
    return tuple(Loss(r.index, r.kind, r.status, r.detail, r.output_tokens, r.max_tokens, r.request_id)
                 for r in records if not complete(r))


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _difference(before: RequestRecord, after: RequestRecord, sampled: bool) -> Difference:
    a, b = before.token_ids, after.token_ids
    k = _first_difference(a, b)
    tokens = (a[k], b[k]) if k < min(len(a), len(b)) else None
    return Difference(before.index, sampled, k, after.request_id, tokens, tuple(a[:k]))


def compare(workload: Workload, baseline: Sequence[RequestRecord], faulted: Sequence[RequestRecord]) -> Comparison:
    """Records are matched by request index; only requests complete in both runs are compared."""
    sampled = {r.index: is_sampled(r) for r in workload.requests}
    before = {r.index: r for r in baseline if complete(r)}
    pairs = [(before[r.index], r) for r in faulted if complete(r) and r.index in before]
    differences = tuple(_difference(b, f, sampled[b.index]) for b, f in pairs if b.token_ids != f.token_ids)
    seeded = sum(sampled[b.index] for b, _ in pairs)
    return Comparison(len(pairs) - seeded, seeded, differences)


def overlaps(start: float, end: float, windows: Sequence[Window]) -> bool:
    return any(start <= w.end_s and w.start_s <= end for w in windows)


def _split(records: Sequence[RequestRecord], windows: Sequence[Window]) -> TbtSplit:
    during, outside = [], []
    for record in records:
        for start, end in zip(record.token_times, record.token_times[1:]):
            (during if overlaps(start, end, windows) else outside).append(end - start)
    return TbtSplit(distribution(during), distribution(outside))


def split_tbt(records: Sequence[RequestRecord], windows: Sequence[Window]) -> TbtSplit:
    """Chat TBT samples during and outside the fault windows, all chats and per priority class."""
    chats = [r for r in records if r.kind == "chat"]
    classes = tuple((p, _split([r for r in chats if r.priority == p], windows))
                    for p in ("vip", "normal", "batch") if any(r.priority == p for r in chats))
    whole = _split(chats, windows)
    return TbtSplit(whole.during, whole.outside, classes)


def chat_tbt(records: Sequence[RequestRecord]) -> Distribution | None:
    return distribution([g for r in records if r.kind == "chat" for g in r.gaps_s])
