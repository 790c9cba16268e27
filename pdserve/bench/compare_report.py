"""The seed's table and the issue's ratios, computed from the runs of `bench --compare`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from pdserve.bench.report import to_json
from pdserve.bench.runner import RunResult
from pdserve.bench.stats import GroupSummary, summarize_run
from pdserve.stats import Slo


@dataclass(frozen=True)
class CompareRuns:
    mixed: dict[str, RunResult]  # configuration name -> its run of the mixed workload
    chat: RunResult  # the same chats without the documents, on the disaggregated service
    alone: tuple[RunResult, ...]  # each document of mixed alone on the idle disaggregated service
    shared_cached: RunResult
    shared_uncached: RunResult


@dataclass(frozen=True)
class Row:
    """One line of the seed's table. Times are None when the group has no samples."""

    label: str
    chat_tbt_p50_ms: float | None
    chat_tbt_p99_ms: float | None
    chat_tbt_max_ms: float | None
    chat_ttft_p50_s: float | None
    doc_ttft_mean_s: float | None
    doc_ttft_max_s: float | None
    output_tokens_per_s: float
    failed: int
    preempted_requests: int
    goodput: int
    requests: int


@dataclass(frozen=True)
class Ratio:
    name: str
    numerator: float | None
    denominator: float | None
    limit: float | None  # the bound (at most), None when the ratio is only reported

    @property
    def value(self) -> float | None:
        if self.numerator is None or not self.denominator:
            return None
        return self.numerator / self.denominator

    @property
    def verdict(self) -> str:
        if self.limit is None or self.value is None:
            return "reported"
        return "meets" if self.value <= self.limit else "MISSES"


def _groups(run: RunResult, slo: Slo) -> dict[str, GroupSummary]:
    return {g.name: g for g in summarize_run(run.records, run.duration_s, slo)}


def row(label: str, run: RunResult, slo: Slo) -> Row:
    groups = _groups(run, slo)
    chat, doc, total = groups.get("kind:chat"), groups.get("kind:document"), groups["all"]
    tbt = chat.tbt if chat else None
    ttft = doc.ttft if doc else None
    return Row(label, tbt and tbt.p50 * 1e3, tbt and tbt.p99 * 1e3, tbt and tbt.max * 1e3,
               chat.ttft.p50 if chat and chat.ttft else None, ttft and ttft.mean, ttft and ttft.max,
               total.output_tokens_per_s, sum(total.failed.values()), total.preempted_requests, total.goodput,
               total.requests)


def _doc_ttfts(run: RunResult) -> dict[int, float]:
    return {r.index: r.ttft_s for r in run.records if r.kind == "document" and r.ttft_s is not None}


def _ttft_p50(run: RunResult, slo: Slo) -> float | None:
    ttft = _groups(run, slo)["all"].ttft
    return ttft.p50 if ttft else None


def ratios(runs: CompareRuns, rows: dict[str, Row], slo: Slo) -> list[Ratio]:
    base = rows["chat alone (disaggregated)"].chat_tbt_p99_ms
    found = [Ratio(f"chat P99 TBT, mixed on {name} / chat alone", rows[name].chat_tbt_p99_ms, base,
                   1.5 if name == "disaggregated" else None) for name in runs.mixed]
    if "colocated-fcfs" in rows:  # the stall: chats frozen while a whole document prefills
        fcfs = rows["colocated-fcfs"].chat_tbt_max_ms
        found.append(Ratio("chat max TBT, mixed on colocated-fcfs / chat alone (the stall)", fcfs,
                           rows["chat alone (disaggregated)"].chat_tbt_max_ms, None))
        if "disaggregated" in rows:
            found.append(Ratio("chat max TBT, mixed on colocated-fcfs / mixed on disaggregated", fcfs,
                               rows["disaggregated"].chat_tbt_max_ms, None))
    if "disaggregated" in runs.mixed:
        mixed = _doc_ttfts(runs.mixed["disaggregated"])
        alone = {i: t for run in runs.alone for i, t in _doc_ttfts(run).items() if i in mixed}
        found.append(Ratio("document TTFT, mixed on disaggregated / alone (documents finished in both)",
                           sum(mixed[i] for i in alone) or None, sum(alone.values()) or None, 1.3))
    found.append(Ratio("shared-prefix TTFT p50, prefix cache / none", _ttft_p50(runs.shared_cached, slo),
                       _ttft_p50(runs.shared_uncached, slo), 0.3))
    return found


def compare_rows(runs: CompareRuns, slo: Slo) -> dict[str, Row]:
    rows = {name: row(name, run, slo) for name, run in runs.mixed.items()}
    rows["chat alone (disaggregated)"] = row("chat alone (disaggregated)", runs.chat, slo)
    return rows


def _f(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_compare(rows: Sequence[Row], found: Sequence[Ratio]) -> str:
    header = (f"{'configuration':28} {'chat TBT p50 ms':>15} {'p99 ms':>7} {'max ms':>7} {'chat TTFT p50 s':>15} "
              f"{'doc TTFT mean s':>15} {'max s':>6} {'tok/s':>6} {'failed':>6} {'preempted':>9} {'goodput':>8}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.label:28} {_f(r.chat_tbt_p50_ms, 0):>15} {_f(r.chat_tbt_p99_ms, 0):>7} "
                     f"{_f(r.chat_tbt_max_ms, 0):>7} {_f(r.chat_ttft_p50_s, 2):>15} {_f(r.doc_ttft_mean_s, 2):>15} "
                     f"{_f(r.doc_ttft_max_s, 2):>6} {r.output_tokens_per_s:6.1f} {r.failed:6d} "
                     f"{r.preempted_requests:9d} {r.goodput:4d}/{r.requests:<3d}")
    lines.append("")
    for q in found:
        bound = f" (bound <= {q.limit:g})" if q.limit is not None else ""
        lines.append(f"{q.name}: {_f(q.value, 2)} = {_f(q.numerator, 3)} / {_f(q.denominator, 3)}{bound} "
                     f"{q.verdict}")
    return "\n".join(lines)


def compare_json(runs: CompareRuns, rows: Sequence[Row], found: Sequence[Ratio], slo: Slo, meta: dict) -> dict:
    documents = {f"mixed/{name}": to_json(run, slo) for name, run in runs.mixed.items()}
    documents["chat/disaggregated"] = to_json(runs.chat, slo)
    documents.update({f"alone/{run.workload.name}": to_json(run, slo) for run in runs.alone})
    documents["shared-prefix/prefix-cache"] = to_json(runs.shared_cached, slo)
    documents["shared-prefix/no-prefix-cache"] = to_json(runs.shared_uncached, slo)
    return {"meta": meta, "rows": [asdict(r) for r in rows],
            "ratios": [{**asdict(q), "value": q.value, "verdict": q.verdict} for q in found], "runs": documents}
