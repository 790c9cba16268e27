"""The screen table, the JSON document, the compare table, its ratios and the plot."""

from __future__ import annotations

import json

import pytest

from pdserve.bench import workloads
from pdserve.bench.compare_report import CompareRuns, Ratio, compare_json, compare_rows, format_compare, ratios
from pdserve.bench.records import RequestRecord
from pdserve.bench.report import format_table, to_json, write_json
from pdserve.bench.stats import Slo, summarize_run
from tests.bench.synthetic import fake_run


def test_table_has_a_line_per_group_and_the_failures():
    run = fake_run(workloads.build("mixed", 10, 1.0, 0), failed=(2,))
    slo = Slo()
    text = format_table(run, summarize_run(run.records, run.duration_s, slo), slo)
    lines = text.splitlines()
    assert lines[0].startswith("workload mixed: 10 requests")
    names = [line.split()[0] for line in lines[3:]]
    assert names == ["all", "vip", "normal", "batch", "kind:chat", "kind:document"]
    assert "INTERNAL=1" in lines[3]


def test_json_holds_summary_and_every_request_with_token_times(tmp_path):
    run = fake_run(workloads.build("chat", 5, 1.0, 0), tbt_s=0.05)
    path = tmp_path / "out" / "bench.json"
    write_json(path, to_json(run, Slo(2.0, 0.5)))
    doc = json.loads(path.read_text())
    assert doc["workload"] == {"name": "chat", "seed": 0, "rate": 1.0, "requests": 5}
    assert doc["slo"] == {"ttft_s": 2.0, "tbt_s": 0.5}
    assert doc["summary"]["all"]["completed"] == 5
    assert doc["summary"]["all"]["tbt"]["p50"] == pytest.approx(0.05)
    back = [RequestRecord.from_dict(r) for r in doc["requests"]]
    assert back == list(run.records)
    assert len(back[0].token_times) == run.workload.requests[0].max_tokens


def _runs(disagg_stall: float = 0.0) -> CompareRuns:
    mixed = workloads.build("mixed", 10, 1.0, 0)
    chats = workloads.chat(len(mixed.of_kind(workloads.Kind.CHAT)), 1.0, 0)
    doc = mixed.of_kind(workloads.Kind.DOCUMENT)[0]
    shared = workloads.build("shared-prefix", 4, 1.0, 0)
    return CompareRuns(
        {"colocated-fcfs": fake_run(mixed, stall_s=3.0, doc_ttft_s=2.0),
         "disaggregated": fake_run(mixed, stall_s=disagg_stall, doc_ttft_s=2.4)},
        fake_run(chats), (fake_run(mixed.alone(doc), doc_ttft_s=2.0),),
        fake_run(shared), fake_run(shared))


def test_compare_rows_and_ratios():
    runs = _runs()
    rows = compare_rows(runs, Slo())
    assert list(rows) == ["colocated-fcfs", "disaggregated", "chat alone (disaggregated)"]
    assert rows["disaggregated"].chat_tbt_p99_ms == pytest.approx(100.0)
    assert rows["colocated-fcfs"].chat_tbt_max_ms == pytest.approx(3100.0)
    assert rows["disaggregated"].doc_ttft_mean_s == pytest.approx(2.4)
    found = {q.name: q for q in ratios(runs, rows, Slo())}
    tbt = found["chat P99 TBT, mixed on disaggregated / chat alone"]
    assert tbt.value == pytest.approx(1.0) and tbt.verdict == "meets"
    assert found["chat P99 TBT, mixed on colocated-fcfs / chat alone"].value > 5
    doc = found["document TTFT, mixed on disaggregated / alone (documents finished in both)"]
    assert doc.value == pytest.approx(1.2) and doc.limit == 1.3
    shared = found["shared-prefix TTFT p50, prefix cache / none"]
    assert shared.value == pytest.approx(1.0) and shared.verdict == "MISSES"


def test_a_ratio_without_data_is_only_reported():
    assert Ratio("x", None, 2.0, 1.5).value is None and Ratio("x", None, 2.0, 1.5).verdict == "reported"
    assert Ratio("x", 1.0, 0.0, 1.5).value is None


def test_compare_text_and_json(tmp_path):
    runs = _runs()
    rows = compare_rows(runs, Slo())
    found = ratios(runs, rows, Slo())
    text = format_compare(list(rows.values()), found)
    assert "colocated-fcfs" in text and "bound <= 1.5" in text
    doc = compare_json(runs, list(rows.values()), found, Slo(), {"argv": ["x"]})
    index = runs.alone[0].records[0].index
    assert set(doc["runs"]) == {"mixed/colocated-fcfs", "mixed/disaggregated", "chat/disaggregated",
                                f"alone/mixed:{index}-alone", "shared-prefix/prefix-cache",
                                "shared-prefix/no-prefix-cache"}
    assert json.loads(json.dumps(doc))["ratios"][0]["verdict"] in ("meets", "MISSES", "reported")


def test_plot_writes_a_png(tmp_path):
    from pdserve.bench.plot import plot_tbt

    path = tmp_path / "tbt.png"
    plot_tbt(_runs(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
