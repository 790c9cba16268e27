"""An engine whose chunks are sized by time: a long prompt runs in chunks whose steps its cost
model predicted within the target (the model as it stood when each step was scheduled), the
output is the same greedy tokens, and the coefficients come from a probe measured at start and
kept for the next engine."""

from __future__ import annotations

import pytest

from pdserve.config import CacheConfig, EngineConfig, SchedulerConfig
from pdserve.engine import start_probes
from pdserve.engine.engine import Engine
from pdserve.scheduler.step_cost import StepCoefficients
from tests.engine.driver import GREEDY, Arrival, assert_all_blocks_released, run, tiny_prompt

MODEL = "llama_gqa_llama3"
TARGET_S = 0.05
COST = StepCoefficients(fixed_s=0.002, decode_row_s=0.001, prefill_token_s=0.001, context_pair_s=1e-6)


def timed_engine(loaded, min_chunk_tokens: int = 4) -> Engine:
    scheduler = SchedulerConfig(token_budget=1024, max_chunk_tokens=1024, aging_seconds=None, chunking="time",
                                step_time_target_s=TARGET_S, min_chunk_tokens=min_chunk_tokens)
    config = EngineConfig(attention_backend="torch", cache=CacheConfig(block_size=4, num_blocks=256,
                                                                       num_host_blocks=0), scheduler=scheduler)
    return Engine(config, loaded=loaded)


@pytest.mark.timeout(120)
def test_a_long_prompt_runs_in_chunks_predicted_within_the_target(tiny_loaded, oracle, monkeypatch):
    monkeypatch.setattr(start_probes, "step_cost_at_start", lambda *args: COST)  # a fake machine
    loaded = tiny_loaded[MODEL]
    engine = timed_engine(loaded)
    predicted: list[tuple[float, int]] = []  # per step: predicted seconds, its largest chunk
    learn = engine.scheduler.observe

    def observe(output, seconds):
        predicted.append((engine.scheduler.predicted_step_s(output), max(c.num_tokens for c in output.chunks)))
        learn(output, seconds)

    engine.scheduler.observe = observe
    prompts = {"chat": tiny_prompt(6, loaded.config.vocab_size, seed=1),
               "document": tiny_prompt(300, loaded.config.vocab_size, seed=2)}
    trace = run(engine, [Arrival("chat", prompts["chat"]), Arrival("document", prompts["document"], at=2)])
    document = [n for step, sizes in zip(trace.scheduled, trace.chunk_sizes)
                for rid, n in zip(step, sizes) if rid == "document" and n > 1]
    assert sum(document) >= 300 - 1 and len(document) >= 2  # split: the whole of it is over the target
    assert all(seconds <= TARGET_S + 1e-12 for seconds, largest in predicted if largest > 4)
    for name, prompt in prompts.items():
        assert trace.tokens(name) == oracle.greedy(MODEL, prompt, GREEDY.max_tokens), name
    assert_all_blocks_released(engine)


@pytest.mark.timeout(120)
def test_the_step_cost_is_measured_at_start_and_kept(tiny_loaded, monkeypatch, tmp_path):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    first = timed_engine(tiny_loaded[MODEL]).measured.step_cost
    assert first is not None and min(first.fixed_s, first.decode_row_s, first.prefill_token_s,
                                     first.context_pair_s) >= 0.0
    assert first.fixed_s + first.prefill_token_s > 0.0
    assert timed_engine(tiny_loaded[MODEL]).measured.step_cost == first  # read back, not measured again
    assert list((tmp_path / "measured").glob("step-cost-*.json"))
