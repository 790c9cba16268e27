"""The logits-to-distribution steps, and the per-request uniforms."""

from __future__ import annotations

import statistics

import torch

from pdserve.requests import SamplingParams
from pdserve.sampling.filters import SamplingTensors, apply_min_p, apply_top_k, apply_top_p, filtered_probs
from pdserve.sampling.sampler import inverse_cdf
from pdserve.sampling.uniforms import draw_uniforms, seeded_uniform


def test_top_k_keeps_ties_and_ignores_zero_rows():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [1.0, 3.0, 3.0, 2.0]])
    out = apply_top_k(logits, torch.tensor([1, 0]), max_top_k=1)
    assert out[0].tolist() == [-torch.inf, 3.0, 3.0, -torch.inf]
    assert out[1].tolist() == logits[1].tolist()


def test_top_k_larger_than_vocab_is_off():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    assert torch.equal(apply_top_k(logits, torch.tensor([10]), max_top_k=10), logits)


def test_top_p_keeps_the_smallest_nucleus_and_always_the_top_token():
    probs = torch.tensor([[0.1, 0.5, 0.3, 0.1], [0.1, 0.5, 0.3, 0.1], [0.1, 0.5, 0.3, 0.1]])
    out = apply_top_p(probs, torch.tensor([0.75, 0.81, 1e-9]))
    assert (out > 0).tolist() == [[False, True, True, False], [True, True, True, True], [False, True, False, False]]
    assert torch.equal(out[out > 0], probs[out > 0])


def test_top_p_one_keeps_even_the_tiniest_tokens():
    probs = torch.softmax(torch.linspace(0, 60, 4096), dim=-1).unsqueeze(0)  # mass in a few tokens
    out = apply_top_p(probs.expand(2, -1), torch.tensor([1.0, 0.999]))
    assert torch.equal(out[0], probs[0])
    assert (out[1] == 0).sum() > 0


def test_min_p_is_relative_to_the_max():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert (apply_min_p(probs, torch.tensor([0.2])) > 0).tolist() == [[True, True, True, False]]
    assert (apply_min_p(probs, torch.tensor([1.0])) > 0).tolist() == [[True, False, False, False]]


def test_rows_are_filtered_independently():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    params = [
        SamplingParams(temperature=0.5),
        SamplingParams(top_k=3),
        SamplingParams(top_p=0.4),
        SamplingParams(temperature=2.0, min_p=0.3, top_k=10),
    ]
    batch = filtered_probs(logits, SamplingTensors.from_params(params, logits.device))
    for i, p in enumerate(params):
        alone = filtered_probs(logits[i : i + 1], SamplingTensors.from_params([p], logits.device))
        assert torch.equal(batch[i], alone[0])


def test_inverse_cdf_picks_by_cumulative_mass_and_skips_zeros():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]]).expand(5, -1)
    uniforms = torch.tensor([0.0, 0.2499, 0.25, 0.9999999, 1.0 - 2**-53], dtype=torch.float64)
    assert inverse_cdf(probs, uniforms).tolist() == [1, 1, 3, 3, 3]


def test_seeded_uniform_is_a_fixed_function():
    assert seeded_uniform(0, 0) == 0.9336606673349432
    assert seeded_uniform(1234, 7) == 0.9207192782174453
    assert seeded_uniform(1234, 7) != seeded_uniform(1234, 8) != seeded_uniform(1235, 7)


def test_seeded_uniforms_look_uniform():
    values = [seeded_uniform(9, n) for n in range(20000)]
    assert 0.0 <= min(values) and max(values) < 1.0
    assert abs(statistics.mean(values) - 0.5) < 0.01
    assert abs(sum(v < 0.1 for v in values) / len(values) - 0.1) < 0.01


def test_draw_uniforms_mixes_seeded_and_generator_rows():
    params = [SamplingParams(seed=3), SamplingParams(), SamplingParams(seed=4), SamplingParams()]
    values = draw_uniforms(params, [5, 0, 6, 0], torch.Generator().manual_seed(0), torch.device("cpu"))
    expected = torch.rand(2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert values.tolist() == [seeded_uniform(3, 5), expected[0].item(), seeded_uniform(4, 6), expected[1].item()]


def test_top_p_candidate_shortcut_equals_the_full_sort():
    """Peaked rows are settled among the candidates, flat rows fall back to a full sort: both
    must give exactly the full-sort nucleus."""
    g = torch.Generator().manual_seed(5)
    scales = torch.tensor([0.1, 1.0, 4.0, 10.0, 0.5, 8.0]).unsqueeze(1)
    probs = torch.softmax(torch.randn(6, 300, generator=g) * scales, dim=-1)  # [6, 300]
    top_p = torch.tensor([0.9, 0.5, 0.95, 0.3, 1.0, 0.999])
    full = apply_top_p(probs, top_p, candidates=())
    for candidates in ((1,), (8,), (64,), (4, 32), (300,)):
        assert torch.equal(apply_top_p(probs, top_p, candidates=candidates), full)
    assert 0 < int((full[0] > 0).sum()) < 300 and int((full[3] > 0).sum()) < 10
