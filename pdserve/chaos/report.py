"""The screen report and the JSON document of a chaos run."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections import Counter

from pdserve.bench.report import to_json
from pdserve.chaos import analysis, ties
from pdserve.chaos.harness import ChaosResult, Measured
from pdserve.chaos.injector import FaultRecord
from pdserve.chaos.load import is_sampled
from pdserve.stats import Distribution, Slo

HEADER = (f"{'run':9} {'time s':>7} {'lost':>5} {'greedy differ':>13} {'seeded differ':>13} "  # real ones
          f"{'blocks zero after':>22} {'chat TBT p99 ms':>15} {'max ms':>7}")


MARGIN_UNITS = {ties.Rule.GREEDY: "in logits", ties.Rule.SEEDED: "of the CDF mass"}


def _ms(d: Distribution | None, field: str) -> str:
    return "-" if d is None else f"{getattr(d, field) * 1e3:.0f}"


def _fault_line(record: FaultRecord, started_at: float) -> str:
    if record.started_at is None:
        return f"  {record.fault.describe()}  {record.outcome.value}"
    begin, end = record.started_at - started_at, record.ended_at - started_at
    return f"  {record.fault.describe()}  began {begin:.1f} s, ended {end:.1f} s ({record.outcome.value})"


def _row(label: str, m: Measured, greedy: str, seeded: str) -> str:
    tbt = analysis.chat_tbt(m.result.records)
    lost = len(analysis.losses(m.result.records))
    return (f"{label:9} {m.result.duration_s:7.1f} {lost:5d} {greedy:>13} {seeded:>13} {m.drain.describe():>22} "
            f"{_ms(tbt, 'p99'):>15} {_ms(tbt, 'max'):>7}")


def _tbt(d: Distribution | None) -> str:
    if d is None:
        return "no samples"
    return f"p99 {d.p99 * 1e3:.0f} ms, max {d.max * 1e3:.0f} ms ({d.count} gaps)"


def _tbt_lines(split: analysis.TbtSplit) -> list[str]:
    lines = [f"  chat TBT during faults: {_tbt(split.during)}; outside faults: {_tbt(split.outside)}"]
    return lines + [f"    {name:6} during: {_tbt(s.during)}; outside: {_tbt(s.outside)}" for name, s in split.by_priority]


def _losses(m: Measured) -> list[str]:
    counted = Counter((loss.status, loss.detail[:90]) for loss in analysis.losses(m.result.records))
    return [f"    {n} x {status}: {detail}" for (status, detail), n in counted.most_common()]


def _judged(j: ties.Judgement) -> str:
    d = j.difference
    tokens = "one output ends" if d.tokens is None else f"{d.tokens[0]} vs {d.tokens[1]}"
    line = f"    #{d.index} {'seeded' if d.sampled else 'greedy'} at {d.first_index}: {tokens} ({d.request_id}); "
    if j.margin is None:
        return line + j.rule.value
    return line + (f"margin {j.margin:.2g} {MARGIN_UNITS[j.rule]} (epsilon {j.epsilon:g}); "
                   f"the reference picks {j.reference_token}")


def _judgement_lines(r: ChaosResult) -> list[str]:
    v = r.verdict
    if not r.judgements:
        return []
    real = [j for j in r.judgements if not j.tie]
    near = [j for j in r.judgements if j.tie]
    lines = [f"  outputs that differ, judged by {r.tie_judge}: {v.greedy_differ} greedy and {v.seeded_differ} "
             f"seeded real, {v.greedy_ties} greedy and {v.seeded_ties} seeded near-ties"]
    if near:
        lines += ["  near-ties, not failing (request, sampling, index: no-fault vs faulted token, request id; margin):",
                  *map(_judged, near)]
    if real:
        lines += ["  real differences (request, sampling, index: no-fault vs faulted token, request id; margin):",
                  *map(_judged, real)]
    return lines


def format_report(r: ChaosResult) -> str:
    w, c, v = r.workload, r.comparison, r.verdict
    kinds = Counter(q.kind.value for q in w.requests)
    sampled = sum(is_sampled(q) for q in w.requests)
    lines = [f"chaos, seed {r.config.seed}: {len(w.requests)} requests "
             f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}; {sampled} sampled with a seed) "
             f"on {r.faulted.fleet}",
             f"faults: {len(r.schedule)} planned, {v.faults_injected} injected"]
    lines += [_fault_line(f, r.faulted.result.started_at) for f in r.faulted.faults]
    lines += ["", HEADER, "-" * len(HEADER), _row("no-fault", r.baseline, "-", "-"),
              _row("faulted", r.faulted, f"{v.greedy_differ}/{c.greedy_compared}",
                   f"{v.seeded_differ}/{c.seeded_compared}"), *_tbt_lines(r.tbt)]
    for label, m in (("no-fault", r.baseline), ("faulted", r.faulted)):
        found = _losses(m)
        if found:
            lines += [f"  lost in the {label} run:", *found]
    lines += _judgement_lines(r)
    verdict = "PASS" if v.passed else "FAIL: " + "; ".join(v.failures)
    lines += [f"verdict (blocks bound {v.blocks_bound_s:g} s): {verdict}"]
    return "\n".join(lines)


def _plain(value):
    """Dataclasses, enums and tuples as JSON values (a float that is not finite as its name)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _measured_json(m: Measured) -> dict:
    return {"fleet": m.fleet, "faults": _plain(m.faults), "blocks": _plain(m.drain),
            "losses": _plain(analysis.losses(m.result.records)), "run": to_json(m.result, Slo())}


def to_document(r: ChaosResult) -> dict:
    v = r.verdict
    return {"config": _plain(r.config), "schedule": _plain(r.schedule), "windows": _plain(r.windows),
            "comparison": {**_plain(r.comparison), "greedy_differ": r.comparison.greedy_differ,
                           "seeded_differ": r.comparison.seeded_differ},
            "judgements": {"judge": r.tie_judge, "each": _plain(r.judgements)},
            "tbt": _plain(r.tbt), "verdict": {**_plain(v), "passed": v.passed, "failures": list(v.failures)},
            "baseline": _measured_json(r.baseline), "faulted": _measured_json(r.faulted)}
