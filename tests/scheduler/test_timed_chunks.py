"""Chunks sized by time (TimedChunks) against a fake cost model: the largest chunk whose step is
predicted within the target, the token caps still caps, a floor for progress, attention's cost
growing with the context, and a cost model that learns from the steps it observes. No timing."""

from __future__ import annotations

import pytest

from pdserve.config import CacheConfig, SchedulerConfig
from pdserve.requests import Priority, Request
from pdserve.scheduler import make_scheduler
from pdserve.scheduler.chunking import CappedChunks, TimedChunks, WholePrompt
from pdserve.scheduler.factory import _chunking
from pdserve.scheduler.output import make_chunk
from pdserve.scheduler.plan import StepPlan
from pdserve.scheduler.step_cost import StepCoefficients, StepCostModel, StepLoad
from tests.scheduler.fakes import KV_BYTES_PER_TOKEN, FakeExecutor

# 10 ms a step, 1 ms a decode row or prompt token, 1 us per query-key pair
COST = StepCoefficients(fixed_s=0.010, decode_row_s=0.001, prefill_token_s=0.001, context_pair_s=1e-6)
NO_PAIRS = StepCoefficients(fixed_s=0.010, decode_row_s=0.001, prefill_token_s=0.001, context_pair_s=0.0)


def timed(cost: StepCoefficients = NO_PAIRS, target_s: float = 0.1, min_tokens: int = 8,
          max_chunk: int = 1024) -> TimedChunks:
    return TimedChunks(StepCostModel(cost), target_s, min_tokens, max_chunk)


def plan_with(decodes: int = 0, prefill: tuple[int, int] | None = None, budget: int = 4096) -> StepPlan:
    """A step holding `decodes` one-token chunks (context 16 each) and a prefill chunk (start, n)."""
    plan = StepPlan(budget, now=0.0)
    for i in range(decodes):
        plan.add_chunk(Request(f"d{i}", [1] * 16, output_token_ids=[2]), 1, ())
        plan.chunks[-1].start = 16
    if prefill is not None:
        start, n = prefill
        request = Request("p", [1] * (start + n + 1))
        request.num_computed_tokens = start
        plan.add_chunk(request, n, ())
    return plan


@pytest.mark.timeout(10)
def test_a_load_counts_rows_prompt_tokens_and_query_key_pairs():
    load = StepLoad().with_chunk(start=15, num_tokens=1).with_chunk(start=100, num_tokens=4)
    assert load == StepLoad(decode_rows=1, prefill_tokens=4, context_pairs=16 + (400 + 10))
    request = Request("r", list(range(200)))
    chunks = [make_chunk(request, 15, 1, ()), make_chunk(request, 100, 4, ())]
    assert StepLoad().with_chunks(chunks) == load


@pytest.mark.timeout(10)
def test_the_chunk_is_the_largest_whose_step_is_predicted_within_the_target():
    policy = timed()
    assert policy.size(5000, 0, plan_with()) == 90  # 10 ms + 90 x 1 ms = 100 ms
    assert policy.size(5000, 0, plan_with(decodes=20)) == 70  # the decodes took 20 ms of it
    assert policy.size(40, 0, plan_with()) == 40  # what remains
    assert timed(max_chunk=64).size(5000, 0, plan_with()) == 64  # the token caps still cap
    assert policy.size(5000, 0, plan_with(budget=50)) == 50


@pytest.mark.timeout(10)
def test_a_chunk_deep_in_a_long_prompt_is_smaller_as_attention_reads_more_context():
    policy = timed(COST)
    sizes = [policy.size(5000, start, plan_with()) for start in (0, 1000, 4000)]
    assert sizes[0] > sizes[1] > sizes[2] > 0
    for start, n in zip((0, 1000, 4000), sizes):
        assert COST.seconds(StepLoad().with_chunk(start, n)) <= 0.1 < COST.seconds(StepLoad().with_chunk(start, n + 1))


@pytest.mark.timeout(10)
def test_a_step_over_its_target_still_advances_one_prompt_by_the_minimum():
    policy = timed(min_tokens=8)
    full = plan_with(decodes=100)  # 110 ms of decodes alone
    assert policy.size(5000, 0, full) == 8  # the step's first prefill chunk: progress
    assert policy.size(3, 0, full) == 3
    assert policy.size(5000, 0, plan_with(decodes=100, prefill=(0, 8))) == 0  # a second one waits
    assert policy.size(5000, 0, plan_with(decodes=20, prefill=(0, 62))) == 8  # a later one: 8 or more, or none
    assert policy.size(5000, 0, plan_with(decodes=20, prefill=(0, 66))) == 0  # 4 would fit: fewer than 8


@pytest.mark.timeout(10)
def test_the_cost_model_learns_a_slower_machine_and_the_chunks_shrink():
    model = StepCostModel(NO_PAIRS, weight=0.5)
    policy = TimedChunks(model, 0.1, 8, 1024)
    before = policy.size(5000, 0, plan_with())
    load = StepLoad(prefill_tokens=90)
    corrections = []
    for _ in range(12):
        model.observe(load, 2 * NO_PAIRS.seconds(load))  # every step took twice the prediction
        corrections.append(model.correction)
    assert corrections == sorted(corrections) and 1.9 < corrections[-1] <= 2.0
    assert policy.size(5000, 0, plan_with()) < before
    model.observe(load, 1e6)  # one wild step moves it at most to the bound
    assert model.correction <= 4.0


@pytest.mark.timeout(10)
def test_config_picks_tokens_or_time_and_fcfs_stays_whole():
    assert isinstance(_chunking(SchedulerConfig(), None), CappedChunks)
    assert isinstance(_chunking(SchedulerConfig(chunking="time"), COST), TimedChunks)
    assert isinstance(_chunking(SchedulerConfig(chunking="time"), None), TimedChunks)  # seeded by the prefill speed
    assert isinstance(_chunking(SchedulerConfig(policy="fcfs", chunking="time"), COST), WholePrompt)
    with pytest.raises(ValueError, match="unknown chunking"):
        make_scheduler(SchedulerConfig(chunking="bytes"), CacheConfig(), KV_BYTES_PER_TOKEN, 4096)


@pytest.mark.timeout(30)
def test_a_long_prompt_beside_decodes_runs_in_steps_predicted_within_the_target():
    cache = CacheConfig(block_size=16, num_blocks=512, num_host_blocks=0)
    config = SchedulerConfig(token_budget=2048, max_chunk_tokens=1024, chunking="time", step_time_target_s=0.1,
                             min_chunk_tokens=8, aging_seconds=None)
    scheduler = make_scheduler(config, cache, KV_BYTES_PER_TOKEN, 8192, step_cost=COST)
    executor = FakeExecutor(cache)
    for i in range(4):
        scheduler.add(Request(f"chat{i}", [5] * 20, priority=Priority.VIP))
    scheduler.add(Request("document", [7] * 2000))
    document_chunks = []
    while scheduler.has_work():
        output = scheduler.schedule()
        assert scheduler.predicted_step_s(output) <= 0.1 + 1e-12
        document_chunks += [c.num_tokens for c in output.chunks
                            if c.request.request_id == "document" and c.start < 2000]
        scheduler.update(output, executor.execute(output))
        scheduler.check_integrity()
    assert sum(document_chunks) == 2000 and len(document_chunks) > 2000 // 90
    assert document_chunks[-2] < document_chunks[1]  # the context it attends to grew
