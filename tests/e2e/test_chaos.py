"""A CI-sized chaos run on real processes (across test hosts where they can be made): 2 prefill + 2
decode workers in deterministic mode, 40 concurrent streams, 4
seeded faults (SIGKILL, SIGSTOP/SIGCONT, SIGTERM): nothing lost, every output exactly as without
faults (no tie judge), every worker back to zero active blocks within the bound."""

from __future__ import annotations

import pytest

from pdserve.chaos import harness
from pdserve.chaos.report import format_report
from pdserve.chaos.scenarios import config
from pdserve.chaos.schedule import FaultKind
from pdserve.procs.hosts import HostNetwork

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# Seed 3 with faults placed within 2-10 s: SIGSTOP decode-0 (at 2.5 s, for 2.0 s) and prefill-1, SIGKILL
# prefill-0 (5.1 s), SIGTERM decode-0 (7.7 s). Chats arrive at 4 a second (the last at 10.0 s for this
# seed), so the load outlasts the last fault however fast the machine serves it. The span is short
# because a decode worker steps as long as any stream runs, each step reading the whole model: a
# run's CPU follows its length more than its tokens.
CI = {"streams": 40, "rate": 4.0, "chat_words": (40, 120), "chat_tokens": (12, 20), "faults": 4, "stop_s": (2.0, 4.0),
      "recovery_s": 25.0, "span_s": 10.0, "seed": 3, "progress": False, "duration_limit_s": 400.0,
      "recovery_timeout_s": 180.0, "kv_timeout_s": 10.0,  # the KV timeout the other test fleets use
      "deterministic": True}


def test_a_ci_sized_chaos_run_loses_nothing_changes_nothing_and_leaks_no_block():
    """Across test hosts (router and each worker on one of its own) where this machine can make
    them, else every process here: the KV crosses a network, and the one-host paths have every
    other fleet test."""
    fleet_kind = "separate" if HostNetwork.unavailable() else "hosts"
    result = harness.run(config("default", {**CI, "fleet_kind": fleet_kind}))
    report = format_report(result)
    print(report)
    v = result.verdict
    assert {f.kind for f in result.schedule} == set(FaultKind)
    assert v.faults_injected >= 4, report
    assert (v.lost, v.baseline_lost) == (0, 0), report
    assert (v.greedy_differ, v.seeded_differ, v.greedy_ties, v.seeded_ties) == (0, 0, 0, 0), report
    assert "exact equality" in result.tie_judge, report
    assert result.comparison.greedy_compared + result.comparison.seeded_compared == 40, report
    assert v.blocks_zero_after_s is not None and v.blocks_zero_after_s <= v.blocks_bound_s, report
    assert v.faults_not_recovered == 0, report
    assert v.passed, report
