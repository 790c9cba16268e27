"""The verdict fails on a lost request, an output changed for real (not a near-tie), blocks held past the bound or a worker not back."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdserve.chaos.verdict import Verdict

CLEAN = Verdict(lost=0, baseline_lost=0, greedy_differ=0, seeded_differ=0, greedy_ties=0, seeded_ties=0,
                blocks_zero_after_s=1.5,
                baseline_blocks_zero_after_s=0.2, blocks_bound_s=40.0, faults_injected=4, faults_not_recovered=0)


def test_a_clean_run_passes():
    assert CLEAN.passed and CLEAN.failures == ()


@pytest.mark.parametrize("change, reason", [
    ({"lost": 2}, "2 requests lost under faults"),
    ({"baseline_lost": 1}, "1 requests lost without faults"),
    ({"greedy_differ": 1}, "outputs differ from the no-fault run: 1 greedy, 0 seeded"),
    ({"seeded_differ": 3}, "outputs differ from the no-fault run: 0 greedy, 3 seeded"),
    ({"blocks_zero_after_s": 40.5}, "active blocks under faults not back to zero within 40 s"),
    ({"blocks_zero_after_s": None}, "active blocks under faults not back to zero within 40 s"),
    ({"baseline_blocks_zero_after_s": None}, "active blocks without faults not back to zero within 40 s"),
    ({"faults_not_recovered": 1}, "1 workers not serving again after their fault"),
])
def test_each_failure_fails_the_verdict_with_its_reason(change, reason):
    verdict = replace(CLEAN, **change)
    assert not verdict.passed
    assert verdict.failures == (reason,)


def test_near_ties_alone_do_not_fail_it():
    assert replace(CLEAN, greedy_ties=1, seeded_ties=2).passed


def test_blocks_exactly_at_the_bound_pass():
    assert replace(CLEAN, blocks_zero_after_s=40.0).passed


def test_every_failure_is_listed():
    verdict = replace(CLEAN, lost=1, seeded_differ=1, blocks_zero_after_s=None)
    assert len(verdict.failures) == 3
