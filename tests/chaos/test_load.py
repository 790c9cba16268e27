"""The chaos load: the same seed gives the same requests; priorities, lengths and sampling as specified."""

from __future__ import annotations

from collections import Counter

import pytest

from pdserve.bench.workloads import Kind
from pdserve.chaos.load import LoadSpec, build, is_sampled
from pdserve.requests import Priority


def test_the_same_seed_gives_the_same_requests_and_another_seed_others():
    assert build(LoadSpec(streams=20, documents=2), 3) == build(LoadSpec(streams=20, documents=2), 3)
    assert build(LoadSpec(streams=20), 3).requests != build(LoadSpec(streams=20), 4).requests


def test_chats_and_documents_with_the_asked_lengths_all_sent_at_once():
    w = build(LoadSpec(streams=40, documents=3, chat_words=(40, 160), chat_tokens=(16, 32), document_tokens=8), 0)
    chats, docs = w.of_kind(Kind.CHAT), w.of_kind(Kind.DOCUMENT)
    assert len(chats) == 40 and len(docs) == 3
    assert all(16 <= r.max_tokens <= 32 for r in chats) and all(r.max_tokens == 8 for r in docs)
    assert all(r.priority is Priority.BATCH and len(r.prompt.split()) > 1700 for r in docs)
    assert all(40 <= len(r.prompt.split()) <= 175 for r in chats)  # 40-160 words and the punctuation's joins
    assert {r.arrival_s for r in w.requests} == {0.0}
    assert [r.index for r in w.requests] == list(range(43))


def test_a_quarter_vip_some_batch_and_half_sampled_with_their_own_seeds():
    w = build(LoadSpec(streams=200, documents=4), 1)
    priorities = Counter(r.priority for r in w.of_kind(Kind.CHAT))
    assert 30 <= priorities[Priority.VIP] <= 70 and priorities[Priority.BATCH] == 25
    sampled = [r for r in w.requests if is_sampled(r)]
    assert len(sampled) == 102
    assert all(r.seed is not None and r.temperature > 0 for r in sampled)
    assert len({r.seed for r in sampled}) == len(sampled)
    assert all(r.seed is None and r.temperature == 0 for r in w.requests if not is_sampled(r))


def test_a_rate_spreads_arrivals_and_keeps_the_prompts():
    at_once, spread = build(LoadSpec(streams=30), 2), build(LoadSpec(streams=30, rate=2.0), 2)
    assert max(r.arrival_s for r in spread.requests) > 5.0
    assert sorted(r.prompt for r in at_once.requests) == sorted(r.prompt for r in spread.requests)


@pytest.mark.parametrize("streams", [1, 7])
def test_small_loads_build(streams):
    assert len(build(LoadSpec(streams=streams), 0).requests) == streams
