"""The sampler: greedy, per-request seeds, unseeded draws, and support restriction."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pdserve.requests import SamplingParams
from pdserve.sampling import Sampler
from pdserve.sampling import sampler as sampler_module

V = 64


@pytest.fixture
def logits() -> torch.Tensor:
    return torch.randn(6, V, generator=torch.Generator().manual_seed(0)) * 3  # [6, V]


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_all_greedy_is_one_argmax_and_never_filters(logits, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the all-greedy path must not filter")

    monkeypatch.setattr(sampler_module, "filtered_probs", fail)
    params = [SamplingParams(temperature=0.0)] * 6
    assert Sampler().sample(logits, params, [0] * 6, gen()) == logits.argmax(dim=-1).tolist()


def test_greedy_ties_go_to_the_lowest_id():
    row = torch.zeros(1, V)
    row[0, [7, 3, 50]] = 5.0
    assert Sampler().sample(row, [SamplingParams(temperature=0.0)], [0], gen()) == [3]


def test_mixed_batch_keeps_greedy_rows_greedy(logits):
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.5, seed=i) for i in range(6)]
    tokens = Sampler().sample(logits, params, list(range(6)), gen())
    greedy = logits.argmax(dim=-1).tolist()
    assert [tokens[i] for i in (1, 3, 5)] == [greedy[i] for i in (1, 3, 5)]
    assert all(0 <= t < V for t in tokens)


def test_row_count_mismatch_is_an_error(logits):
    with pytest.raises(ValueError, match="6 rows"):
        Sampler().sample(logits, [SamplingParams()] * 5, [0] * 5, gen())


def _others(n: int) -> list[SamplingParams]:
    kinds = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=5, seed=99),
        SamplingParams(temperature=1.3, top_p=0.5),
        SamplingParams(temperature=1.0, min_p=0.2, seed=7),
    ]
    return [kinds[i % len(kinds)] for i in range(n)]


def test_seeded_request_ignores_its_batch(logits):
    """The same request alone and among 5 others, in every row, with other generator states."""
    mine = SamplingParams(temperature=1.0, top_p=0.9, seed=1234)
    row = logits[0]
    for n in range(20):
        alone = Sampler().sample(row.unsqueeze(0), [mine], [n], gen(n))[0]
        for position in range(6):
            batch = logits.clone()
            batch[position] = row
            params = _others(6)
            params[position] = mine
            indices = [3 * i for i in range(6)]
            indices[position] = n
            tokens = Sampler().sample(batch, params, indices, gen(1000 + position))
            assert tokens[position] == alone


def test_seeded_draws_vary_with_index_and_seed():
    flat = torch.zeros(1, V)
    draws = {Sampler().sample(flat, [SamplingParams(seed=5)], [n], gen())[0] for n in range(200)}
    assert len(draws) > V // 2
    by_seed = {Sampler().sample(flat, [SamplingParams(seed=s)], [0], gen())[0] for s in range(200)}
    assert len(by_seed) > V // 2


def test_unseeded_rows_follow_the_generator(logits):
    params = [SamplingParams(temperature=1.0)] * 6
    first = Sampler().sample(logits, params, [0] * 6, gen(42))
    assert Sampler().sample(logits, params, [0] * 6, gen(42)) == first
    runs = {tuple(Sampler().sample(logits, params, [0] * 6, gen(s))) for s in range(20)}
    assert len(runs) > 1


def support(logits_row: torch.Tensor, params: SamplingParams, draws: int = 3000) -> set[int]:
    """Token ids drawn from one row over many seeds, sampled as one batch."""
    batch = logits_row.expand(draws, -1).contiguous()  # [draws, V]
    seeded = [dataclasses.replace(params, seed=s) for s in range(draws)]
    return set(Sampler().sample(batch, seeded, [0] * draws, gen()))


def test_top_k_restricts_support(logits):
    row = logits[1]
    top5 = set(row.topk(5).indices.tolist())
    assert support(row, SamplingParams(temperature=5.0, top_k=5)) == top5
    assert support(row, SamplingParams(temperature=5.0, top_k=1)) == {int(row.argmax())}
    assert len(support(row, SamplingParams(temperature=5.0, top_k=V * 2))) > 5


def test_top_p_restricts_support_to_the_nucleus(logits):
    row = logits[2]
    probs = torch.softmax(row, dim=-1)
    order = probs.argsort(descending=True).tolist()
    cumulative = probs[order].cumsum(0)
    size = int((cumulative < 0.6).sum()) + 1
    assert support(row, SamplingParams(top_p=0.6)) == set(order[:size])


def test_min_p_restricts_support(logits):
    row = logits[3]
    probs = torch.softmax(row / 2.0, dim=-1)
    allowed = set(torch.nonzero(probs >= 0.1 * probs.max()).flatten().tolist())
    assert 1 < len(allowed) < V
    assert support(row, SamplingParams(temperature=2.0, min_p=0.1)) == allowed


def test_filters_compose(logits):
    row = logits[4]
    drawn = support(row, SamplingParams(temperature=10.0, top_k=8, top_p=0.5))
    assert drawn <= set(row.topk(8).indices.tolist())
    assert 1 < len(drawn) < 8


def test_frequencies_follow_the_tempered_distribution():
    row = torch.tensor([2.0, 1.0, 0.0, -1.0, -30.0])
    draws = 20000
    batch = row.expand(draws, -1).contiguous()
    tokens = Sampler().sample(batch, [SamplingParams(temperature=0.8)] * draws, [0] * draws, gen(3))
    counts = torch.bincount(torch.tensor(tokens), minlength=5).double() / draws
    expected = torch.softmax(row.double() / 0.8, dim=-1)
    assert torch.allclose(counts, expected, atol=0.015)
    assert counts[4] == 0


def test_masked_vocabulary_is_never_drawn():
    row = torch.full((1, V), -torch.inf)
    row[0, [10, 20]] = 0.0
    batch = row.expand(500, -1).contiguous()
    tokens = Sampler().sample(batch, [SamplingParams(seed=s) for s in range(500)], [0] * 500, gen())
    assert set(tokens) == {10, 20}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_for_seeded_and_greedy(logits):
    params = [SamplingParams(temperature=0.0)] + [SamplingParams(temperature=1.0, top_p=0.9, seed=s) for s in range(5)]
    cpu = Sampler().sample(logits, params, list(range(6)), gen())
    cuda = Sampler().sample(logits.cuda(), params, list(range(6)), torch.Generator("cuda").manual_seed(0))
    assert cuda == cpu


def test_tiny_temperature_is_effectively_greedy(logits):
    params = [SamplingParams(temperature=1e-30, seed=s) for s in range(6)]
    assert Sampler().sample(logits, params, [0] * 6, gen()) == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_argmax_rows_takes_torchs_choice_on_ties_nan_and_infinities(dtype):
    from pdserve.sampling.sampler import argmax_rows

    rows = torch.randn(8, 300, generator=gen(1)).to(dtype)
    rows[0, 5] = rows[0, 250] = 50  # a tie: the lower id
    rows[1, 17] = float("nan")
    rows[1, 40] = float("inf")  # NaN wins over +inf, the first NaN over a later one
    rows[1, 99] = float("nan")
    rows[2, 33] = float("inf")
    rows[3] = float("-inf")  # every entry equal: the first
    rows[4] = 0.0
    chosen = argmax_rows(rows)
    assert chosen.dtype == torch.int64
    assert chosen.tolist() == rows.argmax(dim=-1).tolist()
    assert chosen[:5].tolist() == [5, 17, 33, 0, 0]
    columns = rows.t().contiguous().t()  # the same values, column-major
    assert argmax_rows(columns).tolist() == rows.argmax(dim=-1).tolist()


def test_mixed_greedy_and_sampled_rows_keep_the_greedy_rows_argmax(logits):
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=3)] * 3
    tokens = Sampler().sample(logits, params, [0] * 6, gen())
    assert tokens[0::2] == logits[0::2].argmax(dim=-1).tolist()
