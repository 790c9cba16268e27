"""Objectives, the TTFT prediction's arithmetic and the admission verdicts, as pure functions."""

from __future__ import annotations

import math

import pytest

from pdserve.admission import (Admission, AdmissionPolicy, Objective, Objectives, PrefillSide, TtftPrediction,
                               Verdict, parse_objectives, predict_ttft)
from pdserve.requests import Priority


def _prediction(total_s: float, worker: str = "p") -> TtftPrediction:
    return TtftPrediction(0.0, 0.0, total_s, 0.0, worker)


def test_objectives_parse_per_class_and_name_what_is_wrong():
    objectives = parse_objectives("vip=2, normal=10", "vip=0.2")
    assert objectives.of(Priority.VIP) == Objective(2.0, 0.2)
    assert objectives.of(Priority.NORMAL) == Objective(10.0, None)
    assert objectives.of(Priority.BATCH) == Objective() and not objectives.of(Priority.BATCH).any
    assert objectives.any and not parse_objectives().any
    for ttft, needle in (("gold=1", "unknown class"), ("vip=0", "> 0"), ("vip=-1", "> 0"), ("vip=nan", "> 0"),
                         ("vip", "> 0"), ("vip=inf", "> 0"), ("vip=1,vip=2", "twice")):
        with pytest.raises(ValueError, match=needle):
            parse_objectives(ttft)
    with pytest.raises(ValueError, match="--tbt-objective"):
        parse_objectives("", "normal=x")


def test_a_prediction_adds_the_reservation_the_queue_the_uncached_prompt_and_the_last_piece():
    side = PrefillSide("p0", queued_tokens=3000, tokens_per_s=1000.0, cached_tokens=200, transfer_s=0.01)
    p = predict_ttft(1200, side, reserve_s=0.05, fallback_tokens_per_s=99.0)
    assert (p.reserve_s, p.queue_s, p.prefill_s, p.transfer_s) == (0.05, 3.0, 1.0, 0.01)
    assert math.isclose(p.total_s, 4.06) and p.prefill_worker == "p0"
    assert p.attributes()["pdserve.ttft.predicted_s"] == p.total_s
    whole = predict_ttft(100, PrefillSide("p1", 0, 1000.0, cached_tokens=100), 0.0, 1.0)
    assert whole.prefill_s == 0.001  # the last token is computed however much is cached
    unknown = predict_ttft(500, PrefillSide("p2", 500, 0.0), 0.0, fallback_tokens_per_s=500.0)
    assert (unknown.queue_s, unknown.prefill_s) == (1.0, 1.0)
    with pytest.raises(ValueError, match="no prefill speed"):
        predict_ttft(10, PrefillSide("p3", 0, 0.0), 0.0, fallback_tokens_per_s=0.0)


def test_a_reservation_taken_when_the_prefill_starts_overlaps_the_prefill():
    side = PrefillSide("p0", queued_tokens=3000, tokens_per_s=1000.0, cached_tokens=200, transfer_s=0.01)
    short = predict_ttft(1200, side, reserve_s=0.05, fallback_tokens_per_s=99.0, overlapped=True)
    assert math.isclose(short.total_s, 3.0 + 1.0 + 0.01)  # blocks reserved while the prompt computes
    long = predict_ttft(1200, side, reserve_s=2.5, fallback_tokens_per_s=99.0, overlapped=True)
    assert math.isclose(long.total_s, 3.0 + 2.5 + 0.01)  # the pieces wait for them
    assert long.attributes()["pdserve.ttft.predicted.overlapped"] is True


POLICY = AdmissionPolicy(parse_objectives("vip=1,normal=5,batch=30", "normal=0.5"), defer_max_s=60.0)


@pytest.mark.parametrize("priority, remote, local, step_s, deferred_s, verdict, reason", [
    (Priority.NORMAL, 4.0, None, 0.1, 0.0, Verdict.ADMIT, "within"),
    (Priority.NORMAL, 6.0, 2.0, 0.1, 0.0, Verdict.LOCAL, "local_within"),
    (Priority.NORMAL, 6.0, 7.0, 0.1, 0.0, Verdict.REFUSE, "ttft"),
    (Priority.NORMAL, 4.0, None, 0.6, 0.0, Verdict.REFUSE, "tbt"),
    (Priority.VIP, 1.5, None, 9.0, 0.0, Verdict.REFUSE, "ttft"),  # no TBT objective for VIPs
    (Priority.BATCH, 40.0, None, 0.1, 0.0, Verdict.DEFER, "ttft"),
    (Priority.BATCH, 40.0, None, 0.1, 60.0, Verdict.ADMIT, "deferred_too_long"),
])
def test_verdicts(priority, remote, local, step_s, deferred_s, verdict, reason):
    admission = POLICY.decide(priority, _prediction(remote, "remote"),
                              None if local is None else _prediction(local, "local"), step_s, deferred_s)
    assert (admission.verdict, admission.reason) == (verdict, reason)


def test_a_refusal_says_when_to_retry_the_predicted_excess_at_least_the_floor():
    refused = POLICY.decide(Priority.NORMAL, _prediction(12.0), _prediction(9.0, "local"), 0.1)
    assert refused.verdict is Verdict.REFUSE and refused.retry_after_s == pytest.approx(4.0)  # the better path's
    assert refused.prediction.prefill_worker == "local"
    barely = POLICY.decide(Priority.NORMAL, _prediction(5.2), None, 0.1)
    assert barely.retry_after_s == POLICY.min_retry_after_s
    slow_steps = POLICY.decide(Priority.NORMAL, _prediction(1.0), None, 0.9)
    assert slow_steps.retry_after_s == POLICY.min_retry_after_s


def test_without_an_objective_or_a_path_everything_is_admitted():
    assert AdmissionPolicy().decide(Priority.NORMAL, _prediction(1e6), None, 1e3) == Admission(
        Verdict.ADMIT, "no_objective", _prediction(1e6))
    assert POLICY.decide(Priority.NORMAL, None, None, 0.0).verdict is Verdict.ADMIT
    only_batch = AdmissionPolicy(Objectives({Priority.BATCH: Objective(1.0)}))
    assert only_batch.decide(Priority.VIP, _prediction(100.0), None, 0.0).verdict is Verdict.ADMIT
