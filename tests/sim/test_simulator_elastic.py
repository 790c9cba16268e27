"""An elastic split in the simulator: the router's planner (pdserve.elastic, unchanged) changes
instances' roles; a decode instance leaving moves its running requests with their KV. Changes
are forced by construction (a backlog no single prefill instance clears, a decode pool too small
for the chats), and every run checks the schedulers' integrity after every step."""

import pytest

from pdserve.requests import Priority
from pdserve.sim import get_hardware, get_shape
from pdserve.sim.deployment import Disaggregated, InfeasibleDeployment, SimConfig, check, parse_split
from pdserve.sim.metrics import summarize
from pdserve.sim.simulator import simulate
from pdserve.sim.workloads import RequestSpec, Workload, get_workload

H100 = get_hardware("h100-sxm")
LLAMA8B = get_shape("llama-3.1-8b")
KV_PER_TOKEN = LLAMA8B.kv_bytes_per_token()
COARSE = 256  # tokens per KV block: few blocks, so checking every block after every step stays cheap


def _workload(*specs: RequestSpec) -> Workload:
    return Workload("test", tuple(sorted(specs, key=lambda r: r.arrival_s)), "test")


def _all_served(result) -> None:
    summary = summarize(result)
    assert summary.failed == 0 and summary.unfinished == 0
    assert all(len(t.token_times) == t.spec.output_tokens for t in result.traces)


@pytest.mark.parametrize("reserve_at", ["arrival", "prefill"])
def test_a_document_burst_takes_a_decode_instance_whose_running_requests_move_with_their_kv(reserve_at):
    # Twenty 16K documents are about 6 s of one prefill instance's work and take a quarter of
    # the three decode pools (their blocks are reserved there first), so the decode side can
    # spare an instance: the planner moves one to prefill, and the chats running there leave
    # with their KV.
    docs = [RequestSpec(f"doc-{i}", 1.0 + 0.01 * i, 16_384, 16, Priority.BATCH, "document") for i in range(20)]
    chats = [RequestSpec(f"chat-{i}", 2.5 + 0.02 * i, 256, 512, Priority(i % 2), "chat") for i in range(16)]
    workload = _workload(*chats, *docs)
    cfg = SimConfig(H100, LLAMA8B, block_size=COARSE, reserve_at=reserve_at)
    result = simulate(workload, Disaggregated(1, 1, 3, 1, elastic=True), cfg, check_integrity=True)
    _all_served(result)
    begun = [c for c in result.role_changes if "begun" in c]
    assert begun and "from decode to prefill (prefill_backlog" in begun[0]
    done = [c for c in result.role_changes if "done: decode-" in c and "serves as prefill" in c]
    # Nothing it held waited on the backlog: reservations whose prompts were still queued went
    # elsewhere, the running chats left with their KV (simulated time: the same in every run).
    assert done and float(done[0].split()[0]) - float(begun[0].split()[0]) < 1.0
    prompts = sum(workload.prompt_tokens()) * KV_PER_TOKEN
    assert result.kv_transferred_bytes > prompts  # the moved requests' KV crossed too, prompt and tokens


def test_a_decode_pool_too_small_for_the_chats_takes_a_prefill_instance():
    # A decode pool of about 30K tokens holds a dozen of the forty 2.5K-token chats: requests
    # wait there for blocks while the prefill instances have nothing queued.
    chats = [RequestSpec(f"chat-{i}", 0.01 * i, 2048, 512, Priority.NORMAL, "chat") for i in range(40)]
    cfg = SimConfig(H100, LLAMA8B, memory_fraction=0.25, block_size=COARSE)
    result = simulate(_workload(*chats), Disaggregated(2, 1, 1, 1, elastic=True), cfg, check_integrity=True)
    _all_served(result)
    assert "from prefill to decode (decode_waiting" in result.role_changes[0]
    assert any("done: prefill-" in c and "serves as decode" in c for c in result.role_changes)


def test_a_static_split_changes_nothing_and_an_elastic_one_is_named_and_checked():
    workload = get_workload("mixed")
    assert simulate(workload, Disaggregated(1, 1, 2, 1), SimConfig(H100, LLAMA8B)).role_changes == ()
    cfg = SimConfig(H100, LLAMA8B)
    assert parse_split("2P6D", cfg, elastic=True) == Disaggregated(2, 1, 6, 1, elastic=True)
    assert "elastic" in Disaggregated(2, 1, 6, 1, elastic=True).name
    with pytest.raises(InfeasibleDeployment, match="TP must be equal"):
        check(Disaggregated(2, 2, 6, 1, elastic=True), cfg)
    with pytest.raises(InfeasibleDeployment, match="at least three instances"):
        check(Disaggregated(1, 1, 1, 1, elastic=True), cfg)
