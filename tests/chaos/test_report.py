"""The verdict of a judged run, its screen report and its JSON document, from synthetic runs."""

from __future__ import annotations

import json
from dataclasses import replace

from pdserve.bench.records import OK, RequestRecord
from pdserve.bench.runner import RunResult
from pdserve.chaos.blocks import Drain, WorkerBlocks
from pdserve.chaos.config import ChaosConfig
from pdserve.chaos.harness import Measured, judge, windows_of
from pdserve.chaos.injector import FaultRecord, Outcome
from pdserve.chaos.load import LoadSpec, build
from pdserve.chaos.report import format_report, to_document
from pdserve.chaos.schedule import Fault, FaultKind
from pdserve.chaos.ties import Call, Judgement, Rule, StrictJudge, TieJudge

T0 = 1.7e9
CONFIG = ChaosConfig(load=LoadSpec(streams=6, documents=1, chat_tokens=(4, 4), document_tokens=4))
WORKLOAD = build(CONFIG.load, 0)
KILL = Fault(2.0, FaultKind.KILL, "decode-1")


def records(stall_at: float | None = None, changed: int | None = None, failed: int | None = None) -> tuple:
    """Every request: 4 tokens 1 s apart from t = 1 (a 5 s stall after `stall_at`)."""
    out = []
    for r in WORKLOAD.requests:
        times = [1.0 + i for i in range(4)]
        if stall_at is not None:
            times = [t + (5.0 if t > stall_at else 0.0) for t in times]
        tokens = [r.index, 1, 2, 3 if r.index != changed else 9]
        status = "UNAVAILABLE" if r.index == failed else OK
        out.append(RequestRecord(r.index, r.kind.value, r.priority.name.lower(), r.max_tokens, sent_s=0.0,
                                 token_times=times, token_counts=[1] * 4, token_ids=tokens, done_s=times[-1],
                                 status=status, detail="no prefill worker is ready" if failed == r.index else ""))
    return tuple(out)


def measured(recs: tuple, faults: tuple[FaultRecord, ...] = (), zero_after: float | None = 0.5) -> Measured:
    drain = Drain(zero_after, 55.0, (WorkerBlocks("decode-1", 0 if zero_after is not None else 12),))
    return Measured(RunResult("127.0.0.1:1", WORKLOAD, T0, max(r.done_s for r in recs), recs, (0.1, 0.2)),
                    faults, drain, "fake fleet")


class TieOn(TieJudge):
    """Calls the differences of the given requests near-ties (margin 3e-6), the others real."""

    def __init__(self, *indices: int):
        self.indices = indices

    def judge(self, request, difference) -> Judgement:
        if request.index in self.indices:
            return Judgement(difference, Call.TIE, Rule.SEEDED, 3e-6, 1e-4, difference.tokens[0])
        return Judgement(difference, Call.REAL, Rule.GREEDY, 0.75, 1e-4, difference.tokens[0])

    def describe(self) -> str:
        return "a test's judge"


def kill_record() -> FaultRecord:
    return FaultRecord(KILL, Outcome.RECOVERED, T0 + 2.5, T0 + 4.0)


def test_a_faithful_run_passes_and_its_stall_counts_during_the_fault():
    result = judge(CONFIG, WORKLOAD, (KILL,), measured(records()), measured(records(stall_at=2.5), (kill_record(),)))
    assert result.verdict.passed
    assert result.windows == windows_of((kill_record(),), T0, CONFIG.settle_s)
    assert result.windows[0].start_s == 2.5 and result.windows[0].end_s == 4.0 + CONFIG.settle_s
    assert (result.tbt.during.count, result.tbt.during.max) == (6, 6.0)  # the chats' 2 -> 8 gaps
    assert (result.tbt.outside.count, result.tbt.outside.max) == (12, 1.0)
    text = format_report(result)
    assert "kill  decode-1  began 2.5 s, ended 4.0 s (recovered)" in text
    assert "chat TBT during faults: p99" in text and text.endswith("PASS")


def test_a_lost_request_a_changed_output_and_held_blocks_fail_it_and_are_named():
    faulted = measured(records(changed=1, failed=2), (kill_record(),), zero_after=None)
    result = judge(CONFIG, WORKLOAD, (KILL,), measured(records()), faulted, StrictJudge())
    v = result.verdict
    assert (v.lost, v.greedy_differ + v.seeded_differ, v.blocks_zero_after_s) == (1, 1, None)
    text = format_report(result)
    assert "1 x UNAVAILABLE: no prefill worker is ready" in text
    assert "not zero after 55 s (decode-1=12)" in text
    assert "FAIL: 1 requests lost under faults" in text


def test_a_skipped_fault_is_reported_and_not_counted_as_injected():
    skipped = FaultRecord(replace(KILL, at_s=50.0), Outcome.SKIPPED)
    result = judge(CONFIG, WORKLOAD, (skipped.fault,), measured(records()), measured(records(), (skipped,)))
    assert result.verdict.faults_injected == 0 and result.windows == ()
    assert "kill  decode-1  skipped" in format_report(result)


def test_the_document_is_json_with_the_verdict_and_every_request():
    faulted = measured(records(changed=0), (kill_record(),))
    result = judge(CONFIG, WORKLOAD, (KILL,), measured(records()), faulted, StrictJudge())
    doc = json.loads(json.dumps(to_document(result)))
    assert doc["verdict"]["passed"] is False and doc["verdict"]["failures"]
    assert doc["schedule"][0] == {"at_s": 2.0, "kind": "kill", "target": "decode-1", "stop_s": 0.0}
    assert doc["faulted"]["faults"][0]["outcome"] == "recovered"
    assert len(doc["faulted"]["run"]["requests"]) == len(WORKLOAD.requests)
    assert doc["config"]["plan"]["kinds"] == ["kill", "stop", "term"]
    assert doc["judgements"]["each"][0]["call"] == "real" and doc["judgements"]["each"][0]["rule"].startswith("strict")
    assert doc["verdict"]["greedy_differ"] + doc["verdict"]["seeded_differ"] == 1


def test_a_near_tie_is_reported_with_its_margin_and_does_not_fail_the_run_a_real_one_does():
    near = judge(CONFIG, WORKLOAD, (KILL,), measured(records()), measured(records(changed=1), (kill_record(),)),
                 TieOn(1))
    v = near.verdict
    assert v.passed and (v.greedy_differ, v.seeded_differ, v.greedy_ties + v.seeded_ties) == (0, 0, 1)
    text = format_report(near)
    assert "near-ties, not failing" in text and "#1 " in text and "at 3: 3 vs 9" in text
    assert "margin 3e-06 of the CDF mass (epsilon 0.0001); the reference picks 3" in text and text.endswith("PASS")
    real = judge(CONFIG, WORKLOAD, (KILL,), measured(records()), measured(records(changed=1), (kill_record(),)),
                 TieOn())
    assert not real.verdict.passed and "real differences" in format_report(real)
    assert "outputs differ from the no-fault run" in format_report(real)
