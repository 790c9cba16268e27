"""Capacity planning, deployments, workloads and the `pdserve simulate` command."""

import json

import pytest

from pdserve.cli.main import main
from pdserve.requests import Priority
from pdserve.sim import get_hardware, get_shape
from pdserve.sim.deployment import (
    Colocated,
    Disaggregated,
    InfeasibleDeployment,
    SimConfig,
    check,
    default_tp,
    parse_split,
)
from pdserve.sim.metrics import meets
from pdserve.stats import Slo, percentile
from pdserve.sim.planner import candidates, plan
from pdserve.sim.recorder import RequestTrace
from pdserve.sim.workloads import get_workload, make_request

H100 = get_hardware("h100-sxm")
CFG70 = SimConfig(H100, get_shape("llama-3.1-70b"))
CFG8 = SimConfig(H100, get_shape("llama-3.1-8b"), prefix_cache=False)


def test_planner_tries_every_split_and_returns_them_best_goodput_first():
    slo = Slo(ttft_s=1.0, tbt_s=0.03)
    workload = get_workload("mixed")
    rows = plan(workload, CFG8, 4, slo)
    names = {r.summary.name for r in rows}
    assert names == {d.name for d in candidates(4, CFG8)}
    assert {"1P3D (P 1xTP1, D 3xTP1)", "3P1D (P 3xTP1, D 1xTP1)", "colocated chunked"} <= names
    goodputs = [r.goodput_rps for r in rows]
    assert goodputs == sorted(goodputs, reverse=True) and goodputs[0] > 0
    window = workload.requests[-1].arrival_s - workload.requests[0].arrival_s
    for r in rows:
        assert r.summary.window_s == pytest.approx(window)
        assert r.summary.goodput_rps == pytest.approx(r.summary.slo_met / window)


def test_candidates_skip_tps_that_do_not_fit_or_divide():
    found = candidates(8, CFG70)
    assert Colocated(8, 8) in found and Disaggregated(4, 4, 4, 4) in found
    assert all(d.prefill_tp >= 2 for d in found if isinstance(d, Disaggregated))
    assert not any(isinstance(d, Disaggregated) and d.prefill_gpus in (1, 3, 5, 7) for d in found)


def test_splits_parse_with_the_largest_fitting_tp_and_reject_bad_ones():
    assert parse_split("4P4D", CFG70) == Disaggregated(4, 4, 4, 4)
    assert parse_split("6p2d", CFG70) == Disaggregated(6, 2, 2, 2)
    assert parse_split("4P4D", CFG70, decode_tp=2) == Disaggregated(4, 4, 4, 2)
    assert default_tp(8, CFG70) == 8
    with pytest.raises(ValueError, match="xPyD"):
        parse_split("4-4", CFG70)
    with pytest.raises(InfeasibleDeployment):
        parse_split("1P7D", CFG70)  # TP 1 cannot hold 70B on an 80 GB GPU
    with pytest.raises(InfeasibleDeployment):
        check(Colocated(6, 3), CFG70)  # 3 does not divide 8 KV heads


def test_seed_workload_is_the_seed_mix_and_deterministic():
    w = get_workload("seed", seed=1)
    chats = [r for r in w.requests if r.kind == "chat"]
    docs = [r for r in w.requests if r.kind == "document"]
    assert len(chats) == 100 and len(docs) == 10
    assert {r.prompt_tokens for r in chats} == {1024} and {r.prompt_tokens for r in docs} == {65_536}
    assert {r.priority for r in docs} == {Priority.BATCH}
    assert {r.priority for r in chats} == {Priority.VIP, Priority.NORMAL}
    assert [r.arrival_s for r in w.requests] == sorted(r.arrival_s for r in w.requests)
    assert w == get_workload("seed", seed=1) != get_workload("seed", seed=2)
    with pytest.raises(KeyError, match="known"):
        get_workload("nope")


def test_requests_share_only_the_declared_prefix():
    w = get_workload("shared-prefix")
    a, b = make_request(w.requests[0], 0), make_request(w.requests[1], 1)
    assert a.prompt_token_ids[:8192] == b.prompt_token_ids[:8192]
    assert a.prompt_token_ids[8192] != b.prompt_token_ids[8192]
    assert len(a.prompt_token_ids) == w.requests[0].prompt_tokens
    assert a.sampling.max_tokens == w.requests[0].output_tokens and a.sampling.ignore_eos


def test_percentiles_and_slo_judgement():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    spec = get_workload("chat").requests[0]
    smooth = RequestTrace(spec, [spec.arrival_s + 0.5 + 0.02 * i for i in range(200)], finish_s=10.0)
    stalled = RequestTrace(spec, smooth.token_times[:100] + [t + 3.0 for t in smooth.token_times[100:]], finish_s=13.0)
    slo = Slo(ttft_s=1.0, tbt_s=0.05)
    assert meets(smooth, slo) and meets(stalled, slo)  # one stall in 199 gaps is under the p99
    assert not meets(smooth, Slo(ttft_s=0.4, tbt_s=0.05))
    assert not meets(RequestTrace(spec, smooth.token_times), slo)  # never finished
    stalls = RequestTrace(spec, [t + 3.0 * (i // 20) for i, t in enumerate(smooth.token_times)], finish_s=40.0)
    assert not meets(stalls, slo)


def test_simulate_command_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "sim.json"
    rc = main(["simulate", "--workload", "mixed", "--model", "llama-3.1-8b", "--gpus", "2", "--policy", "fcfs",
               "--policy", "chunked", "--split", "1P1D", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "colocated fcfs" in text and "colocated chunked" in text and "1P1D" in text
    assert "physics on 2 x h100-sxm" in text
    data = json.loads(out.read_text())
    names = [r["summary"]["name"] for r in data["runs"]]
    assert names == ["colocated fcfs", "colocated chunked", "1P1D (P 1xTP1, D 1xTP1)"]
    assert len(data["workload"]["requests"]) == 43 and data["config"]["shape"]["name"] == "llama-3.1-8b"
    assert all(r["min_step_over_bound"] >= 1.0 for r in data["runs"])


def test_plan_command_ranks_splits(capsys):
    rc = main(["simulate", "--plan", "--workload", "mixed", "--model", "llama-3.1-8b", "--gpus", "2",
               "--slo-ttft", "1", "--slo-tbt", "0.05"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "1P1D" in text and "colocated chunked" in text and "goodput" in text


def test_simulate_command_refuses_impossible_requests_with_status_2(capsys):
    assert main(["simulate", "--workload", "nope"]) == 2
    assert main(["simulate", "--workload", "seed", "--split", "3P5D"]) == 2
    assert "fits no TP group of 3" in capsys.readouterr().err
