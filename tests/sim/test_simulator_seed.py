"""The seed's experiment in the simulator: the policies' ordering, and physics never beaten."""

import pytest

from pdserve.sim import get_hardware, get_shape
from pdserve.sim.bounds import min_decode_step_time, min_prefill_time, min_step_time
from pdserve.sim.deployment import Colocated, SimConfig, parse_split
from pdserve.sim.metrics import summarize
from pdserve.sim.simulator import simulate
from pdserve.sim.workloads import get_workload

CFG = SimConfig(get_hardware("h100-sxm"), get_shape("llama-3.1-70b"), prefix_cache=False)
SEED = get_workload("seed")


@pytest.fixture(scope="module")
def runs():
    deployments = {p: Colocated(8, 8, p) for p in ("fcfs", "decode-first", "chunked")}
    deployments["4P4D"] = parse_split("4P4D", CFG)
    return {name: simulate(SEED, d, CFG, trace_steps=True) for name, d in deployments.items()}


@pytest.fixture(scope="module")
def summaries(runs):
    return {name: summarize(r) for name, r in runs.items()}


def test_every_request_finishes_on_eight_gpus(summaries):
    for s in summaries.values():
        assert s.failed == 0 and s.unfinished == 0
        assert s.output_tokens == 100 * 256 + 10 * 512


def test_every_simulated_step_is_at_or_above_its_physical_bound(runs):
    for run in runs.values():
        steps = [s for s in run.samples if s.chunks]
        assert len(steps) == run.steps > 100
        for s in steps:
            assert s.cost.total_s >= min_step_time(CFG.shape, CFG.hardware, s.chunks, s.tp)


def test_no_document_beats_its_prefill_bound_nor_any_token_a_decode_step(runs):
    for name, run in runs.items():
        gpus = 4 if name == "4P4D" else 8
        weights_only = min_decode_step_time(CFG.shape, CFG.hardware, [], gpus)
        for trace in run.traces:
            if trace.spec.kind == "document":
                assert trace.ttft_s >= min_prefill_time(CFG.shape, CFG.hardware, 65_536, gpus)
            assert min(trace.gaps()) >= weights_only


def test_fcfs_stalls_every_stream_while_chunked_keeps_tbt_bounded(summaries):
    fcfs, chunked = summaries["fcfs"].classes["chat"], summaries["chunked"].classes["chat"]
    assert fcfs.tbt_s.p99 > 10 * chunked.tbt_s.p99
    assert fcfs.tbt_s.max > 2.0 > 0.2 > chunked.tbt_s.max


def test_decode_first_starves_the_long_prompts(summaries):
    first, chunked = summaries["decode-first"].classes["document"], summaries["chunked"].classes["document"]
    assert first.ttft_s.p50 > 5 * chunked.ttft_s.p50
    assert summaries["decode-first"].classes["chat"].tbt_s.p99 < summaries["chunked"].classes["chat"].tbt_s.p99


def test_disaggregation_takes_the_chunk_out_of_the_decode_step(summaries):
    split, chunked = summaries["4P4D"], summaries["chunked"]
    assert split.classes["chat"].tbt_s.p99 < 0.5 * chunked.classes["chat"].tbt_s.p99
    assert split.classes["document"].ttft_s.p50 > chunked.classes["document"].ttft_s.p50


def test_mfu_and_throughput_are_physical(summaries):
    for s in summaries.values():
        assert 0 < s.mfu < CFG.hardware.compute_efficiency
        assert s.output_tokens_per_s > 0


def test_four_decode_gpus_preempt_when_the_seed_arrives_at_once():
    burst = get_workload("seed-burst")
    result = simulate(burst, parse_split("4P4D", CFG), CFG)
    summary = summarize(result)
    assert summary.failed == 0 and summary.unfinished == 0
    assert sum(result.preemptions.values()) > 0
    decode = next(i for i in result.instances if i.role == "decode")
    assert decode.kv_blocks * CFG.block_size < sum(burst.prompt_tokens())


def test_tp2_instances_cannot_hold_a_64k_document_on_h100():
    summary = summarize(simulate(SEED, parse_split("2P6D", CFG), CFG))
    assert summary.failed == 10
    assert summary.classes["document"].finished == 0
    assert summary.classes["chat"].finished == 100
