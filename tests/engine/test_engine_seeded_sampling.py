"""A seeded request samples the same tokens whatever else runs beside it, however its prompt is
chunked, whatever the engine's own seed, and after it was preempted (recompute or swap)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdserve.config import PreemptionConfig
from pdserve.requests import Priority
from tests.engine.driver import GREEDY, SEEDED, Arrival, assert_all_blocks_released, make_engine, run, tiny_prompt

MODEL = "llama_untied"
SEEDED_LENGTH = 37


@pytest.fixture(scope="module")
def vocab(tiny_loaded) -> int:
    return tiny_loaded[MODEL].config.vocab_size


@pytest.fixture(scope="module")
def alone(tiny_loaded, vocab) -> list[int]:
    """The seeded request's tokens when it runs alone in a roomy engine."""
    engine = make_engine(tiny_loaded[MODEL])
    return run(engine, [Arrival("seeded", tiny_prompt(SEEDED_LENGTH, vocab, seed=7), SEEDED)]).tokens("seeded")


def _neighbours(vocab: int, after: int = 0) -> list[Arrival]:
    unseeded = replace(SEEDED, seed=None)
    other_seed = replace(SEEDED, seed=99, top_p=1.0, top_k=20)
    return [Arrival("greedy", tiny_prompt(50, vocab, seed=1), GREEDY, at=after),
            Arrival("unseeded", tiny_prompt(12, vocab, seed=2), unseeded, at=after + 1),
            Arrival("other-seed", tiny_prompt(64, vocab, seed=3), other_seed, at=after + 2)]


def test_seeded_request_really_samples(tiny_loaded, vocab, alone, oracle):
    prompt = tiny_prompt(SEEDED_LENGTH, vocab, seed=7)
    assert alone != oracle.greedy(MODEL, prompt, SEEDED.max_tokens)
    engine = make_engine(tiny_loaded[MODEL])
    other = run(engine, [Arrival("s", prompt, replace(SEEDED, seed=4321))]).tokens("s")
    assert other != alone and len(other) == len(alone) == SEEDED.max_tokens


@pytest.mark.parametrize(("token_budget", "max_chunk_tokens", "engine_seed", "start"),
                         [(256, 1024, 0, 0), (256, 1, 1, 3), (256, 7, 2, 1), (8, 7, 3, 2), (64, 64, 4, 5)])
def test_same_tokens_inside_batches_and_chunkings(tiny_loaded, vocab, alone, token_budget, max_chunk_tokens,
                                                  engine_seed, start):
    engine = make_engine(tiny_loaded[MODEL], token_budget=token_budget, max_chunk_tokens=max_chunk_tokens,
                         seed=engine_seed)
    seeded = Arrival("seeded", tiny_prompt(SEEDED_LENGTH, vocab, seed=7), SEEDED, at=start)
    trace = run(engine, [*_neighbours(vocab), seeded])
    assert trace.tokens("seeded") == alone
    assert trace.tokens("unseeded") != trace.tokens("other-seed")


@pytest.mark.parametrize("swap", [False, True])
def test_same_tokens_after_preemption(tiny_loaded, vocab, alone, swap):
    """The seeded request is BATCH, decoding when NORMAL neighbours arrive in a 24-block pool:
    it is the victim."""
    preemption = PreemptionConfig(recompute_below_tokens=0, swap_above_tokens=0) if swap else PreemptionConfig()
    engine = make_engine(tiny_loaded[MODEL], num_blocks=24, num_host_blocks=64 if swap else 0,
                         max_chunk_tokens=16, preemption=preemption)
    seeded = Arrival("seeded", tiny_prompt(SEEDED_LENGTH, vocab, seed=7), SEEDED, Priority.BATCH)
    trace = run(engine, [seeded, *_neighbours(vocab, after=6)])
    victims = [e for e in trace.preemptions if e.request.request_id == "seeded"]
    assert any(e.num_output_tokens > 0 for e in victims), trace.preemptions
    assert {e.mode.value for e in victims} == {"swap" if swap else "recompute"}
    assert trace.tokens("seeded") == alone
    assert_all_blocks_released(engine)
