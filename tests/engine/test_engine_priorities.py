"""Priorities under memory pressure: VIP requests are never preempted, BATCH requests go first."""

from __future__ import annotations

import pytest

from pdserve.config import PreemptionConfig
from pdserve.requests import Priority, SamplingParams
from tests.engine.driver import Arrival, Trace, assert_all_blocks_released, make_engine, run, tiny_prompt

MODEL = "llama_gqa_llama3"
POOL_BLOCKS = 24  # 96 tokens of 4


def _check_outputs(trace: Trace, arrivals: list[Arrival], oracle) -> None:
    for arrival in arrivals:
        expected = oracle.greedy(MODEL, arrival.prompt, arrival.sampling.max_tokens)
        assert trace.tokens(arrival.request_id) == expected, arrival.request_id


def _assert_lowest_class_preempted_first(trace: Trace) -> None:
    """A victim is never chosen while a request of a lower class (higher value) still runs."""
    for i, event in enumerate(trace.preemptions):
        earlier = {e.request.request_id for e in trace.preemptions[:i] if e.step == event.step}
        still_running = [r for r in trace.running_before[event.step] if r.request_id not in earlier]
        lower = [r.request_id for r in still_running if r.priority > event.request.priority]
        assert not lower, f"step {event.step}: {event.request.request_id} preempted while {lower} ran"


def _assert_no_vip_preempted(trace: Trace) -> None:
    assert all(e.request.priority != Priority.VIP for e in trace.preemptions)
    assert all(r.num_preemptions == 0 for r in trace.requests.values() if r.priority == Priority.VIP)


@pytest.mark.parametrize("max_chunk_tokens", [16, 1024])
@pytest.mark.parametrize("swap", [False, True])
def test_batch_is_preempted_first_and_vip_never(tiny_loaded, oracle, max_chunk_tokens, swap):
    loaded = tiny_loaded[MODEL]
    vocab = loaded.config.vocab_size
    preemption = PreemptionConfig(recompute_below_tokens=0, swap_above_tokens=0) if swap else PreemptionConfig()
    engine = make_engine(loaded, num_blocks=POOL_BLOCKS, num_host_blocks=64 if swap else 0,
                         max_chunk_tokens=max_chunk_tokens, preemption=preemption)
    arrivals = [Arrival("vip", tiny_prompt(40, vocab, 1), priority=Priority.VIP),
                Arrival("normal", tiny_prompt(33, vocab, 2), priority=Priority.NORMAL),
                Arrival("batch1", tiny_prompt(30, vocab, 3), priority=Priority.BATCH),
                Arrival("batch2", tiny_prompt(25, vocab, 4), priority=Priority.BATCH)]
    trace = run(engine, arrivals)
    assert trace.preemptions
    _assert_no_vip_preempted(trace)
    _assert_lowest_class_preempted_first(trace)
    _check_outputs(trace, arrivals, oracle)
    assert_all_blocks_released(engine)


def test_arriving_vip_preempts_running_batch_at_once(tiny_loaded, oracle):
    loaded = tiny_loaded[MODEL]
    vocab = loaded.config.vocab_size
    engine = make_engine(loaded, num_blocks=POOL_BLOCKS, max_chunk_tokens=16)
    arrivals = [Arrival("batch1", tiny_prompt(40, vocab, 1), priority=Priority.BATCH),
                Arrival("batch2", tiny_prompt(40, vocab, 2), priority=Priority.BATCH),
                Arrival("vip", tiny_prompt(40, vocab, 3), priority=Priority.VIP, at=3),
                Arrival("normal", tiny_prompt(20, vocab, 4), priority=Priority.NORMAL, at=3)]
    trace = run(engine, arrivals)
    first = trace.preemptions[0]
    assert (first.step, first.reason, first.request.priority) == (3, "higher_priority_waiting", Priority.BATCH)
    assert first.num_output_tokens > 0
    assert "vip" in trace.scheduled[3]
    assert trace.finished_at["vip"] < min(trace.finished_at["batch1"], trace.finished_at["batch2"])
    _assert_no_vip_preempted(trace)
    _assert_lowest_class_preempted_first(trace)
    _check_outputs(trace, arrivals, oracle)
    assert_all_blocks_released(engine)


def test_vips_alone_overcommitting_the_pool_are_never_preempted(tiny_loaded, oracle):
    """Two VIPs that need 40 blocks together in a pool of 24: they wait, nobody is preempted."""
    loaded = tiny_loaded[MODEL]
    sampling = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    engine = make_engine(loaded, num_blocks=POOL_BLOCKS, max_chunk_tokens=16)
    arrivals = [Arrival(f"vip{i}", tiny_prompt(40, loaded.config.vocab_size, 10 + i), sampling, Priority.VIP)
                for i in range(2)]
    trace = run(engine, arrivals, max_steps=400)
    assert not trace.preemptions
    _check_outputs(trace, arrivals, oracle)
    assert_all_blocks_released(engine)
