"""Simulator mechanics: integrity after every step, swaps and recomputes, KV moves, determinism."""

import pytest

from pdserve.requests import Priority
from pdserve.sim import get_hardware, get_shape
from pdserve.sim.deployment import Colocated, Disaggregated, SimConfig
from pdserve.sim.metrics import summarize
from pdserve.sim.simulator import simulate
from pdserve.sim.workloads import RequestSpec, Workload, get_workload

H100 = get_hardware("h100-sxm")
LLAMA8B = get_shape("llama-3.1-8b")


def _small_pressure_workload() -> Workload:
    """Chats of each class and two 20K documents on a pool of ~30K tokens: preemption by both modes."""
    chats = [RequestSpec(f"chat-{i}", 0.05 * i, 600, 48, Priority(i % 2), "chat") for i in range(10)]
    docs = [RequestSpec(f"doc-{i}", 0.02 + 0.1 * i, 20_000, 64, Priority.BATCH, "document") for i in range(2)]
    late = [RequestSpec(f"vip-{i}", 0.3 + 0.05 * i, 6000, 16, Priority.VIP, "chat") for i in range(6)]
    return Workload("pressure", tuple(sorted(chats + docs + late, key=lambda r: r.arrival_s)), "test")


def _tight(host: float = 3e9) -> SimConfig:
    """8B on one H100 with a quarter of its memory: about 30K tokens of KV."""
    return SimConfig(H100, LLAMA8B, memory_fraction=0.25, host_swap_bytes_per_gpu=host)


@pytest.mark.parametrize("policy", ["chunked", "fcfs", "decode-first"])
def test_integrity_holds_after_every_simulated_step_under_memory_pressure(policy):
    result = simulate(_small_pressure_workload(), Colocated(1, 1, policy), _tight(), check_integrity=True)
    summary = summarize(result)
    assert summary.failed == 0 and summary.unfinished == 0
    assert all(len(t.token_times) == t.spec.output_tokens for t in result.traces)
    if policy == "chunked":
        assert sum(result.preemptions.values()) > 0


def test_preempted_documents_swap_to_a_host_pool_and_recompute_without_one():
    workload = _small_pressure_workload()
    swapping = simulate(workload, Colocated(1, 1), _tight(), check_integrity=True)
    assert swapping.preemptions.get("swap", 0) > 0 and swapping.swapped_bytes > 0
    no_host = simulate(workload, Colocated(1, 1), _tight(host=0.0), check_integrity=True)
    assert no_host.preemptions.get("recompute", 0) > 0 and "swap" not in no_host.preemptions
    assert no_host.swapped_bytes == 0
    assert summarize(no_host).unfinished == 0


def test_integrity_holds_in_a_disaggregated_run_and_every_prompt_crosses_once():
    workload = _small_pressure_workload()
    result = simulate(workload, Disaggregated(1, 1, 1, 1), _tight(), check_integrity=True)
    summary = summarize(result)
    assert summary.failed == 0 and summary.unfinished == 0
    assert result.kv_transferred_bytes == sum(workload.prompt_tokens()) * LLAMA8B.kv_bytes_per_token()
    assert {i.role for i in result.instances} == {"prefill", "decode"}


def test_prefix_cache_on_shares_the_document_of_a_shared_prefix_workload():
    workload = get_workload("shared-prefix")
    cfg_on, cfg_off = SimConfig(H100, LLAMA8B, prefix_cache=True), SimConfig(H100, LLAMA8B, prefix_cache=False)
    on = summarize(simulate(workload, Colocated(1, 1), cfg_on)).classes["question"]
    off = summarize(simulate(workload, Colocated(1, 1), cfg_off)).classes["question"]
    assert on.ttft_s.p50 < 0.3 * off.ttft_s.p50


def test_first_token_comes_from_the_prefill_instance_then_decode_takes_over():
    spec = RequestSpec("r", 0.0, 4096, 8, Priority.NORMAL, "chat")
    cfg = SimConfig(H100, LLAMA8B)
    trace = simulate(Workload("one", (spec,), "one"), Disaggregated(1, 1, 1, 1), cfg, trace_steps=True).traces[0]
    prefill_steps = 4096 // cfg.max_chunk_tokens
    assert len(trace.token_times) == 8 and trace.finish_s == trace.token_times[-1]
    assert trace.ttft_s > prefill_steps * 1e-3
    assert min(trace.gaps()) > 0


def test_same_seed_same_run_other_seed_other_run():
    cfg = SimConfig(H100, LLAMA8B, prefix_cache=False)

    def times(seed):
        result = simulate(get_workload("mixed", seed), Colocated(1, 1), cfg)
        return [t.token_times for t in result.traces]

    assert times(3) == times(3)
    assert times(3) != times(4)
    assert get_workload("seed", 7) == get_workload("seed", 7)


def test_requests_that_do_not_fit_fail_instead_of_hanging():
    spec = RequestSpec("huge", 0.0, 120_000, 4, Priority.NORMAL, "document")
    ok = RequestSpec("ok", 0.1, 100, 4, Priority.NORMAL, "chat")
    result = simulate(Workload("w", (spec, ok), "w"), Colocated(1, 1), _tight())
    huge, small = result.traces
    assert huge.failure is not None and "PromptTooLong" in huge.failure and not huge.token_times
    assert small.finish_s is not None
