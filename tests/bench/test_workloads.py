"""Workloads: deterministic, shaped as specified, measured in tokens of the embedded tokenizer."""

from __future__ import annotations

import random
import statistics

import pytest

from pdserve.bench import schedule, workloads
from pdserve.bench.workloads import Kind
from pdserve.requests import Priority


@pytest.fixture(scope="module")
def tokenizer():
    from pdserve.tokenizer import load_tokenizer

    return load_tokenizer(None)


@pytest.mark.parametrize("name", workloads.NAMES)
def test_same_seed_same_workload_other_seed_other_prompts(name):
    a, b, c = workloads.build(name, seed=3), workloads.build(name, seed=3), workloads.build(name, seed=4)
    assert a == b
    assert [r.prompt for r in a.requests] != [r.prompt for r in c.requests]


@pytest.mark.parametrize("name", workloads.NAMES)
def test_requests_numbered_in_arrival_order_from_zero(name):
    w = workloads.build(name, requests=15, rate=2.0, seed=1)
    assert len(w.requests) == 15
    assert [r.index for r in w.requests] == list(range(15))
    times = [r.arrival_s for r in w.requests]
    assert times == sorted(times) and times[0] == 0.0


def test_poisson_gaps_have_the_rate_as_mean():
    times = schedule.poisson_times(random.Random(0), 4001, 2.0, first_at_start=True)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.mean(gaps) == pytest.approx(0.5, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(0.5, rel=0.1)  # exponential: stdev == mean


def test_rate_changes_arrivals_but_not_prompts():
    slow, fast = workloads.build("chat", 10, 0.5, 0), workloads.build("chat", 10, 5.0, 0)
    assert [r.prompt for r in slow.requests] == [r.prompt for r in fast.requests]
    assert slow.requests[-1].arrival_s == pytest.approx(10 * fast.requests[-1].arrival_s)


def test_chat_is_short_normal_and_vip(tokenizer):
    w = workloads.build("chat", requests=40, seed=0)
    assert {r.kind for r in w.requests} == {Kind.CHAT}
    assert {r.priority for r in w.requests} == {Priority.NORMAL, Priority.VIP}
    lengths = [len(tokenizer.encode(r.prompt)) for r in w.requests]
    assert 25 <= min(lengths) and max(lengths) <= 160
    assert all(24 <= r.max_tokens <= 48 for r in w.requests)


def test_mixed_is_the_chat_workload_plus_a_few_long_batch_documents(tokenizer):
    mixed = workloads.build("mixed", requests=27, rate=0.5, seed=2)
    docs = mixed.of_kind(Kind.DOCUMENT)
    chats = mixed.of_kind(Kind.CHAT)
    assert len(docs) == 3 and len(chats) == 24
    alone = workloads.chat(24, 0.5, 2)
    assert [(c.prompt, c.arrival_s, c.priority) for c in chats] == \
           [(c.prompt, c.arrival_s, c.priority) for c in alone.requests]
    assert {d.priority for d in docs} == {Priority.BATCH}
    assert all(1500 <= len(tokenizer.encode(d.prompt)) <= 3000 for d in docs)
    span = chats[-1].arrival_s
    assert all(0 < d.arrival_s < span for d in docs)


def test_mixed_has_a_document_even_when_tiny():
    w = workloads.build("mixed", requests=3, seed=0)
    assert len(w.of_kind(Kind.DOCUMENT)) == 1 and len(w.requests) == 3


def test_shared_prefix_questions_share_a_long_document(tokenizer):
    w = workloads.build("shared-prefix", requests=8, seed=0)
    ids = [tokenizer.encode(r.prompt) for r in w.requests]
    shared = min(next(i for i, (x, y) in enumerate(zip(a, ids[0])) if x != y) for a in ids[1:])
    assert shared >= 1000
    assert all(len(a) - shared <= 40 for a in ids)
    assert {r.kind for r in w.requests} == {Kind.QUESTION}


def test_alone_keeps_the_request_and_sends_it_at_once():
    w = workloads.build("mixed", seed=0)
    doc = w.of_kind(Kind.DOCUMENT)[1]
    solo = w.alone(doc)
    assert len(solo.requests) == 1
    assert solo.requests[0].prompt == doc.prompt and solo.requests[0].index == doc.index
    assert solo.requests[0].arrival_s == 0.0


@pytest.mark.parametrize("bad", [dict(name="nope"), dict(name="chat", requests=0), dict(name="chat", rate=0.0)])
def test_bad_workload_arguments_are_refused(bad):
    with pytest.raises(ValueError):
        workloads.build(**bad)


def test_shifting_is_the_chat_workload_with_a_burst_of_documents_a_third_of_the_way_through():
    shifting = workloads.build("shifting", 36, 0.6, seed=3)
    chats = workloads.chat(31, 0.6, seed=3)
    assert [r.prompt for r in shifting.of_kind(Kind.CHAT)] == [r.prompt for r in chats.requests]
    documents = shifting.of_kind(Kind.DOCUMENT)
    span = max(r.arrival_s for r in chats.requests)
    assert len(documents) == 5 and all(r.priority == Priority.BATCH for r in documents)
    times = [r.arrival_s for r in documents]
    assert times[0] == pytest.approx(span / 3) and times[-1] - times[0] == pytest.approx(2.0)
    assert workloads.build("shifting", 36, 0.6, seed=3) == shifting
