"""A seeded random workload: every policy, tight pools, shared prefixes, all three priorities,
arrivals spread over time and random aborts. Every request that was not aborted gets exactly
transformers' greedy tokens; an aborted one a prefix of them; integrity holds after each step."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from pdserve.config import PreemptionConfig
from pdserve.engine.engine import Engine
from pdserve.requests import FinishReason, Priority
from tests.engine.driver import GREEDY, Arrival, Trace, add, assert_all_blocks_released, make_engine, step, tiny_prompt

MODEL = "llama_gqa_llama3"
MODES = (PreemptionConfig(recompute_below_tokens=10**9),
         PreemptionConfig(recompute_below_tokens=0, swap_above_tokens=0),
         PreemptionConfig(recompute_below_tokens=20, swap_above_tokens=40))


def _engine(loaded, rng: random.Random) -> Engine:
    return make_engine(loaded, num_blocks=rng.randint(20, 32), num_host_blocks=rng.choice([0, 8, 64]),
                       prefix_cache=rng.random() < 0.7, policy=rng.choice(["chunked", "fcfs", "decode-first"]),
                       token_budget=rng.choice([8, 32, 256]), max_chunk_tokens=rng.choice([1, 5, 16, 1024]),
                       preemption=rng.choice(MODES))


def _arrivals(rng: random.Random, vocab: int, capacity: int) -> list[Arrival]:
    prefixes = [tiny_prompt(rng.randint(4, 30), vocab, rng.randrange(10**6)) for _ in range(3)]
    arrivals = []
    for i in range(14):
        head = rng.choice(prefixes) if rng.random() < 0.5 else [1]
        prompt = (head + tiny_prompt(rng.randint(2, 40), vocab, rng.randrange(10**6))[1:])[:70]
        sampling = replace(GREEDY, max_tokens=rng.randint(1, min(16, capacity - len(prompt) - 1)))
        arrivals.append(Arrival(f"r{i}", prompt, sampling, Priority(rng.randint(0, 2)), at=rng.randint(0, 30)))
    return arrivals


def _drive(engine: Engine, arrivals: list[Arrival], rng: random.Random) -> tuple[Trace, set[str]]:
    trace, aborted, pending = Trace(), set(), sorted(arrivals, key=lambda a: a.at)
    while pending or engine.has_unfinished():
        while pending and pending[0].at <= trace.steps:
            add(engine, trace, pending.pop(0))
        live = [r for r in trace.requests.values() if not r.is_finished]
        if live and rng.random() < 0.03:
            victim = rng.choice(live)
            assert engine.abort(victim.request_id)
            aborted.add(victim.request_id)
        assert trace.steps < 3000, engine.scheduler.stats()
        step(engine, trace)
    return trace, aborted


@pytest.mark.parametrize("seed", [1, 3, 5, 15])  # chunked+swap, fcfs, decode-first+both, chunked
def test_random_workload_matches_transformers(tiny_loaded, oracle, seed):
    rng = random.Random(seed)
    loaded = tiny_loaded[MODEL]
    engine = _engine(loaded, rng)
    cache = engine.config.cache
    arrivals = _arrivals(rng, loaded.config.vocab_size, cache.num_blocks * cache.block_size)
    trace, aborted = _drive(engine, arrivals, rng)
    assert trace.preemptions and aborted
    for arrival in arrivals:
        rid, request = arrival.request_id, trace.requests[arrival.request_id]
        expected = oracle.greedy(MODEL, arrival.prompt, arrival.sampling.max_tokens)
        if rid in aborted:
            assert request.output_token_ids == expected[: len(request.output_token_ids)], rid
        else:
            assert (request.output_token_ids, request.finish_reason) == (expected, FinishReason.LENGTH), rid
    assert_all_blocks_released(engine)
