"""AIPerf's per-request records set beside the router's spans by request id."""

from __future__ import annotations

import json

import pytest

from pdserve.bench.span_agreement import agreement, aiperf_records, format_agreement

pytestmark = pytest.mark.timeout(30)


def _record(rid: str, phase: str, ttft_ms: float, itl_ms: float, cancelled: bool = False) -> str:
    return json.dumps({"metadata": {"x_request_id": rid, "benchmark_phase": phase, "was_cancelled": cancelled},
                       "metrics": {"time_to_first_token": {"value": ttft_ms, "unit": "ms"},
                                   "inter_token_latency": {"value": itl_ms, "unit": "ms"}}})


def _span(rid: str, ttft_s: float, e2e_s: float, tokens: int) -> dict:
    return {"gen_ai.request.id": rid, "gen_ai.latency.time_to_first_token": ttft_s, "gen_ai.latency.e2e": e2e_s,
            "gen_ai.usage.output_tokens": tokens}


def test_requests_are_matched_by_id_and_the_gaps_are_client_minus_span(tmp_path):
    jsonl = tmp_path / "profile_export.jsonl"
    jsonl.write_text("\n".join([_record("w", "warmup", 1, 1), _record("a", "profiling", 110, 21),
                                _record("b", "profiling", 215, 19), _record("c", "profiling", 300, 20, cancelled=True),
                                _record("d", "profiling", 90, 20)]))
    client = aiperf_records(jsonl)
    assert sorted(client) == ["a", "b", "d"]  # the warm-up and the cancelled one left out
    found = agreement(client, [_span("a", 0.100, 0.100 + 0.020 * 10, 11), _span("b", 0.200, 0.2 + 0.02 * 10, 11),
                               {"gen_ai.request.id": "x"}])
    assert (found.matched, found.client_only) == (2, 1)
    assert found.ttft_gap_p50_ms == pytest.approx(12.5) and found.ttft_gap_max_ms == pytest.approx(15)
    assert found.itl_gap_p50_ms == pytest.approx(0.0, abs=1e-9) and abs(found.itl_gap_max_ms) == pytest.approx(1.0)
    assert "2 requests matched" in format_agreement("chat", found)


def test_no_span_for_any_request_says_so():
    assert agreement({}, []) is None
    assert "no request matched" in format_agreement("chat", None)
