"""The batch-effect measures on constructed logits: changes counted only where contexts are equal."""

from __future__ import annotations

import pytest
import torch

from pdserve.chaos.batch_effects import EffectSpec, compare, prompts, sampling, shared
from pdserve.chaos.reference import Generated

V = 6
BASE = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -2.0])


def generated(tokens: tuple[int, ...], shifts: list[float]) -> Generated:
    """Position i's logits: BASE with token 1 moved by shifts[i]."""
    rows = []
    for shift in shifts:
        row = BASE.clone()
        row[1] += shift
        rows.append(row)
    return Generated(tokens, (), tuple(rows))


def test_positions_after_the_first_difference_are_left_out():
    a = generated((1, 2, 3), [0.0, 0.0, 0.0])
    b = generated((1, 4, 3), [0.0, 1e-5, 5.0])  # position 2's context differs: its change is not counted
    assert shared(a, b) == 2 and shared(a, a) == 3
    effects = compare([a], [b], [sampling(EffectSpec(), 0)])
    assert effects.gap == pytest.approx(1e-5, rel=1e-2)
    assert effects.logprob_top20 == effects.logprob and 0 < effects.logprob < 1e-5
    assert 0 < effects.cdf < 1e-5
    assert [(p.request, p.index, p.tokens) for p in effects.partings] == [(0, 1, (2, 4))]


def test_identical_ways_change_nothing():
    a = generated((1, 2), [0.0, 0.0])
    effects = compare([a, a], [a, a], [sampling(EffectSpec(), 0), sampling(EffectSpec(), 1)])
    assert (effects.logprob, effects.gap, effects.cdf, effects.partings) == (0.0, 0.0, 0.0, ())


def test_the_prompts_and_seeds_are_fixed_by_the_spec():
    spec = EffectSpec(prompts=3, seed=2)
    assert prompts(spec) == prompts(spec) and len(prompts(spec)) == 3
    assert all(30 <= len(p.split()) <= 90 for p in prompts(spec))
    assert [sampling(spec, i).seed for i in range(3)] == [2000, 2001, 2002]
