"""Logprobs of sampled tokens: the raw log-softmax and its top k, only for rows that asked."""

from __future__ import annotations

import pytest
import torch

from pdserve.requests import SamplingParams
from pdserve.sampling import Sampler, TokenLogprobs, token_logprobs
from pdserve.validation import InvalidSamplingParams, validate_sampling

VOCAB = 50


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3.0


def test_matches_log_softmax_and_topk_row_by_row():
    logits = _logits(4)
    tokens = [3, 17, 0, 49]
    requested = [5, 0, 20, 1]
    got = token_logprobs(logits, tokens, requested)
    assert sorted(got) == [0, 1, 2, 3]
    for row, k in enumerate(requested):
        expected = torch.log_softmax(logits[row], dim=-1)
        values, ids = expected.topk(k) if k else (torch.empty(0), torch.empty(0, dtype=torch.long))
        lp = got[row]
        assert lp.token_id == tokens[row]
        assert lp.logprob == pytest.approx(expected[tokens[row]].item(), abs=1e-6)
        assert [t for t, _ in lp.top] == ids.tolist()
        assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-6)
        assert all(a[1] >= b[1] for a, b in zip(lp.top, lp.top[1:]))


def test_rows_that_did_not_ask_get_nothing_and_do_not_change_the_others():
    logits = _logits(5, seed=1)
    tokens = [1, 2, 3, 4, 5]
    mixed = token_logprobs(logits, tokens, [None, 3, None, None, 2])
    assert sorted(mixed) == [1, 4]
    alone = token_logprobs(logits[[1]], [2], [3])[0]
    assert mixed[1] == alone
    assert len(mixed[4].top) == 2
    assert token_logprobs(logits, tokens, [None] * 5) == {}


def test_computed_before_temperature_and_filters():
    """The raw distribution: a greedy row's token is its maximum, and a filtered sampling row
    reports the same numbers as an unfiltered one."""
    logits = _logits(2, seed=2)
    greedy = SamplingParams(temperature=0.0, logprobs=4)
    filtered = SamplingParams(temperature=0.3, top_k=2, top_p=0.5, min_p=0.2, seed=7, logprobs=4)
    tokens = Sampler().sample(logits, [greedy, filtered], [0, 0], torch.Generator().manual_seed(0))
    got = token_logprobs(logits, tokens, [greedy.logprobs, filtered.logprobs])
    raw = torch.log_softmax(logits, dim=-1)
    assert got[0].logprob == raw[0].max().item() == got[0].top[0][1]
    assert got[0].top[0][0] == tokens[0]
    assert got[1].logprob == pytest.approx(raw[1, tokens[1]].item(), abs=1e-6)
    assert [t for t, _ in got[1].top] == raw[1].topk(4).indices.tolist()


def test_a_small_vocabulary_caps_the_alternatives():
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    lp = token_logprobs(logits, [2], [20])[0]
    assert [t for t, _ in lp.top] == [2, 1, 0]
    assert sum(torch.tensor([v for _, v in lp.top]).exp().tolist()) == pytest.approx(1.0)


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="rows"):
        token_logprobs(_logits(2), [1], [0, 0])


def test_the_result_type_is_frozen():
    lp = TokenLogprobs(1, -0.5)
    assert lp.top == ()
    with pytest.raises(AttributeError):
        lp.logprob = 0.0  # type: ignore[misc]


@pytest.mark.parametrize("k", [None, 0, 1, 20])
def test_valid_logprobs_settings(k):
    assert validate_sampling(SamplingParams(logprobs=k), VOCAB) is None


@pytest.mark.parametrize("k", [-1, 21, 1000])
def test_out_of_range_logprobs_name_the_field(k):
    with pytest.raises(InvalidSamplingParams, match=rf"logprobs must be in \[0, 20\].*got {k}"):
        validate_sampling(SamplingParams(logprobs=k), VOCAB)
