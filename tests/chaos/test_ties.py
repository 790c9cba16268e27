"""The tie judge's decision on constructed logits: greedy and seeded, margins either side of epsilon."""

from __future__ import annotations

import math

import pytest
import torch

from pdserve.bench.workloads import BenchRequest, Kind, Workload
from pdserve.chaos.analysis import Difference
from pdserve.chaos.config import TieSpec
from pdserve.chaos.ties import (Call, ReferenceJudge, Rule, StrictJudge, call, choose, greedy_margin, judge_all,
                                seeded_margin)
from pdserve.requests import Priority
from pdserve.sampling.uniforms import seeded_uniform

EPS = TieSpec().tie_epsilon
V = 8


def logits_with(values: dict[int, float], rest: float = -5.0) -> torch.Tensor:
    out = torch.full((V,), rest)
    for token, value in values.items():
        out[token] = value
    return out


def cdf_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).cumsum(dim=-1)


@pytest.mark.parametrize("gap, expected", [(0.5 * EPS, Call.TIE), (0.99 * EPS, Call.TIE), (1.5 * EPS, Call.REAL),
                                           (0.3, Call.REAL)])
def test_greedy_top_two_are_a_tie_only_when_their_gap_is_under_epsilon(gap, expected):
    logits = logits_with({2: 3.0, 5: 3.0 - gap})
    margin = greedy_margin(logits, 2, 5)
    assert margin == pytest.approx(gap, rel=1e-2)
    assert call(margin, EPS) is expected
    assert greedy_margin(logits, 5, 2) == margin


def test_greedy_tokens_below_a_clear_winner_are_real_however_close_to_each_other():
    logits = logits_with({0: 4.0, 2: 3.0, 5: 3.0})
    assert greedy_margin(logits, 2, 5) == pytest.approx(1.0)


def test_seeded_margin_is_the_distance_to_the_boundary_between_neighbours():
    cdf = cdf_of([0.1, 0.3, 0.2, 0.4])  # boundaries 0.1, 0.4, 0.6, 1.0
    assert seeded_margin(cdf, 0.4 - 0.5 * EPS, 1, 2) == pytest.approx(0.5 * EPS, rel=1e-6)  # inside 1, near 2
    assert seeded_margin(cdf, 0.4 + 0.5 * EPS, 1, 2) == pytest.approx(0.5 * EPS, rel=1e-6)  # inside 2, near 1
    assert seeded_margin(cdf, 0.4 - 2 * EPS, 1, 2) == pytest.approx(2 * EPS, rel=1e-6)
    assert call(seeded_margin(cdf, 0.4 - 0.5 * EPS, 1, 2), EPS) is Call.TIE
    assert call(seeded_margin(cdf, 0.4 - 2 * EPS, 1, 2), EPS) is Call.REAL
    assert seeded_margin(cdf, 0.25, 1, 2) == pytest.approx(0.15)


def test_seeded_margin_counts_the_mass_between_the_two_tokens():
    cdf = cdf_of([0.5, 0.5 * EPS, 3 * EPS, 0.5 - 3.5 * EPS])  # token 1 (0.5 EPS) lies between 0 and 2
    assert seeded_margin(cdf, 0.5, 0, 2) == pytest.approx(0.5 * EPS, rel=1e-6)  # x inside 1: within EPS of both
    assert seeded_margin(cdf, 0.5, 0, 3) == pytest.approx(3.5 * EPS, rel=1e-6)  # 3 EPS of token 2 in between


def test_seeded_margin_is_relative_to_the_total_mass():
    half = torch.tensor([0.05, 0.15, 0.1, 0.2], dtype=torch.float64).cumsum(dim=-1)  # total 0.5 (top-p cut)
    assert seeded_margin(half, 0.4 - 0.5 * EPS, 1, 2) == pytest.approx(0.5 * EPS, rel=1e-5)


def test_a_token_the_filters_removed_is_never_a_tie():
    cdf = cdf_of([0.5, 0.0, 0.5])
    assert seeded_margin(cdf, 0.5, 0, 1) == math.inf


def difference(index: int, sampled: bool, first: int, tokens: tuple[int, int] | None) -> Difference:
    return Difference(index, sampled, first, f"r-{index}", tokens, tuple(range(first)))


def request(index: int, temperature: float = 0.0, seed: int | None = None) -> BenchRequest:
    return BenchRequest(index, 0.0, Kind.CHAT, Priority.NORMAL, f"prompt {index}", 8, temperature, seed)


class FakeReference:
    """Returns the logits it was given; records what it was asked and whether it was closed."""

    def __init__(self, logits: torch.Tensor):
        self.given, self.asked, self.closed = logits, [], False

    def encode(self, prompt: str) -> list[int]:
        return [len(prompt)]

    def logits(self, prompt_ids, prefix) -> torch.Tensor:
        self.asked.append((list(prompt_ids), tuple(prefix)))
        return self.given

    def close(self) -> None:
        self.closed = True


def seeded_logits(seed: int, index: int, offset: float, temperature: float = 0.8) -> torch.Tensor:
    """Logits whose filtered CDF puts the boundary between tokens 3 and 4 at u + offset (u the draw's)."""
    u = seeded_uniform(seed, index)
    probs = torch.full((V,), 1e-3, dtype=torch.float64)
    probs[3] = u + offset - probs[:3].sum()
    probs[4] = 1.0 - probs[:4].sum() - probs[5:].sum()
    return (temperature * probs.log()).float()


@pytest.mark.parametrize("offset, expected", [(0.5 * EPS, Call.TIE), (-0.5 * EPS, Call.TIE), (3 * EPS, Call.REAL),
                                              (-3 * EPS, Call.REAL)])
def test_the_reference_judge_calls_a_seeded_draw_by_its_distance_from_the_boundary(offset, expected):
    reference = FakeReference(seeded_logits(seed=7, index=5, offset=offset))
    judge = ReferenceJudge(lambda: reference)
    got = judge.judge(request(2, 0.8, seed=7), difference(2, True, 5, (3, 4)))
    assert (got.call, got.rule) == (expected, Rule.SEEDED)
    assert got.margin == pytest.approx(abs(offset), rel=1e-2)
    assert got.reference_token == (3 if offset > 0 else 4)
    assert reference.asked == [([len("prompt 2")], (0, 1, 2, 3, 4))]


@pytest.mark.parametrize("gap, expected", [(0.5 * EPS, Call.TIE), (2 * EPS, Call.REAL)])
def test_the_reference_judge_calls_a_greedy_difference_by_the_logit_gap(gap, expected):
    judge = ReferenceJudge(lambda: FakeReference(logits_with({6: 2.0, 1: 2.0 - gap})))
    got = judge.judge(request(0), difference(0, False, 3, (6, 1)))
    assert (got.call, got.rule, got.reference_token) == (expected, Rule.GREEDY, 6)


def test_outputs_of_different_lengths_and_unseeded_draws_are_real_without_asking_the_model():
    reference = FakeReference(logits_with({}))
    judge = ReferenceJudge(lambda: reference)
    assert judge.judge(request(0), difference(0, False, 4, None)).rule is Rule.LENGTH
    assert judge.judge(request(1, 0.8), difference(1, True, 2, (1, 2))).rule is Rule.UNSEEDED
    assert reference.asked == []


def test_the_strict_judge_calls_every_difference_real():
    got = StrictJudge().judge(request(0), difference(0, False, 1, (1, 2)))
    assert (got.call, got.rule, got.margin) == (Call.REAL, Rule.STRICT, None)


def test_judge_all_keeps_the_order_loads_the_reference_once_and_closes_it():
    loads = []

    def load():
        loads.append(FakeReference(logits_with({6: 2.0, 1: 2.0})))
        return loads[-1]

    workload = Workload("chaos", 0, 0.0, (request(0), request(1)))
    got = judge_all(ReferenceJudge(load), workload, (difference(1, False, 2, (6, 1)), difference(0, False, 1, (1, 6))))
    assert [j.difference.index for j in got] == [1, 0] and all(j.tie for j in got)
    assert len(loads) == 1 and loads[0].closed


def test_the_reference_judge_is_not_loaded_when_nothing_differs():
    judge = ReferenceJudge(lambda: pytest.fail("loaded"))
    assert judge_all(judge, Workload("chaos", 0, 0.0, ()), ()) == ()


def test_the_harness_picks_the_reference_for_a_model_it_can_load_else_strict():
    assert isinstance(choose(TieSpec()), ReferenceJudge)
    assert isinstance(choose(TieSpec(tie_judge="strict")), StrictJudge)
    missing = choose(TieSpec(), model="/nonexistent/model.gguf")
    assert isinstance(missing, StrictJudge) and "cannot be loaded" in missing.describe()
    with pytest.raises(ValueError, match="unknown tie judge"):
        choose(TieSpec(tie_judge="lenient"))
