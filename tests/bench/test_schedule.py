"""The shared schedule: draws in a fixed order, fixed sizes draw nothing, arrivals from t = 0 or a gap later."""

from __future__ import annotations

import random

from pdserve.bench.schedule import (Always, Fixed, Kind, Stream, Uniform, VipShare, by_arrival, every, plan,
                                    poisson_times, spread)
from pdserve.requests import Priority


def _words(rng: random.Random, n: int) -> str:
    return " ".join(str(rng.randint(0, 9)) for _ in range(n))


def test_each_request_draws_priority_then_prompt_then_its_rendering_then_output():
    stream = Stream(Kind.CHAT, VipShare(0.5), Uniform(2, 4), Uniform(10, 20))
    planned = plan(stream, [0.0, 1.0], random.Random(3), _words)
    rng = random.Random(3)
    for p in planned:
        priority = Priority.VIP if rng.random() < 0.5 else Priority.NORMAL
        prompt = _words(rng, rng.randint(2, 4))
        assert (p.priority, p.prompt, p.output_tokens) == (priority, prompt, rng.randint(10, 20))
    assert [(p.number, p.arrival_s, p.kind) for p in planned] == [(0, 0.0, Kind.CHAT), (1, 1.0, Kind.CHAT)]


def test_fixed_sizes_and_priorities_take_no_draw():
    rng = random.Random(5)
    planned = plan(Stream(Kind.DOCUMENT, Always(Priority.BATCH), Fixed(600), Fixed(8)), every(0.5, 1.5, 2), rng,
                   lambda _, n: n)
    assert [(p.arrival_s, p.prompt, p.output_tokens, p.priority) for p in planned] == [
        (0.5, 600, 8, Priority.BATCH), (2.0, 600, 8, Priority.BATCH)]
    assert rng.random() == random.Random(5).random()


def test_arrivals_start_at_the_start_or_one_gap_after_it():
    first = poisson_times(random.Random(1), 3, 2.0, start_s=0.2, first_at_start=True)
    later = poisson_times(random.Random(1), 3, 2.0, start_s=0.2)
    assert first[0] == 0.2 and later[0] > 0.2
    assert first[1] == later[0] and first == sorted(first)


def test_spread_and_merge_by_arrival_keep_ties_in_order():
    assert spread(4.0, 2) == [1.0, 3.0] and spread(4.0, 0) == []
    a = plan(Stream(Kind.CHAT, Always(Priority.NORMAL), Fixed(1), Fixed(1)), [0.0, 2.0], random.Random(0),
             lambda _, n: "a")
    b = plan(Stream(Kind.DOCUMENT, Always(Priority.BATCH), Fixed(1), Fixed(1)), [1.0, 2.0], random.Random(0),
             lambda _, n: "b")
    assert [(p.arrival_s, p.prompt) for p in by_arrival(a, b)] == [(0.0, "a"), (1.0, "b"), (2.0, "a"), (2.0, "b")]
