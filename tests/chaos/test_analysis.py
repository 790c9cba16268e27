"""Lost requests, outputs against the no-fault run, and chat TBT during and outside fault windows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdserve.bench.records import OK, RequestRecord
from pdserve.bench.workloads import BenchRequest, Kind, Workload
from pdserve.chaos.analysis import Window, chat_tbt, compare, losses, overlaps, split_tbt
from pdserve.requests import Priority


def record(index: int, times: list[float], kind: str = "chat", status: str = OK, tokens: list[int] | None = None,
           max_tokens: int | None = None) -> RequestRecord:
    tokens = list(range(len(times))) if tokens is None else tokens
    return RequestRecord(index, kind, "normal", len(tokens) if max_tokens is None else max_tokens, sent_s=0.0,
                         token_times=times, token_counts=[1] * len(times), token_ids=tokens, status=status)


def workload(sampled: set[int], n: int) -> Workload:
    base = BenchRequest(0, 0.0, Kind.CHAT, Priority.NORMAL, "hi", 4)
    return Workload("chaos", 0, 0.0, tuple(replace(base, index=i, temperature=0.8 if i in sampled else 0.0,
                                                   seed=i if i in sampled else None) for i in range(n)))


def test_a_gap_is_during_a_fault_when_it_meets_the_window_edges_included():
    windows = (Window(10.0, 15.0),)
    assert overlaps(9.0, 10.0, windows) and overlaps(15.0, 16.0, windows) and overlaps(9.0, 20.0, windows)
    assert overlaps(11.0, 12.0, windows)
    assert not overlaps(8.0, 9.9, windows) and not overlaps(15.1, 17.0, windows)
    assert not overlaps(11.0, 12.0, ())


def test_chat_gaps_split_into_during_and_outside_and_documents_are_left_out():
    chat = record(0, [0.0, 1.0, 2.0, 12.0, 13.0, 20.0, 21.0])  # gaps 1, 1, 10, 1, 7, 1
    doc = record(1, [0.0, 11.0, 30.0], kind="document")
    split = split_tbt([chat, doc], (Window(11.0, 12.5),))
    assert split.during.count == 2 and split.during.max == pytest.approx(10.0)  # 2-12 and 12-13
    assert split.outside.count == 4 and split.outside.max == pytest.approx(7.0)
    assert chat_tbt([chat, doc]).max == pytest.approx(10.0)


def test_without_windows_every_gap_is_outside():
    split = split_tbt([record(0, [0.0, 0.5, 1.5])], ())
    assert split.during is None and split.outside.count == 2


def test_an_error_status_an_unfinished_stream_and_a_short_output_are_lost():
    records = [record(0, [0.0, 1.0]), record(1, [0.0], status="UNAVAILABLE"), record(2, [0.0, 1.0], max_tokens=3),
               record(3, [], status="UNFINISHED", max_tokens=2)]
    found = losses(records)
    assert [(x.index, x.status, x.tokens, x.max_tokens) for x in found] == [
        (1, "UNAVAILABLE", 1, 1), (2, OK, 2, 3), (3, "UNFINISHED", 0, 2)]


def test_outputs_are_compared_per_request_greedy_and_seeded_apart():
    w = workload(sampled={1, 3}, n=5)
    base = [record(i, [0.0, 1.0, 2.0], tokens=[1, 2, 3]) for i in range(5)]
    faulted = [record(0, [0.0, 1.0, 2.0], tokens=[1, 2, 3]),
               record(1, [0.0, 1.0, 2.0], tokens=[1, 9, 9]),
               record(2, [0.0, 1.0, 2.0], tokens=[1, 2, 4]),
               record(3, [0.0], status="UNAVAILABLE", tokens=[1]),  # lost: not compared
               record(4, [0.0, 1.0, 2.0], tokens=[1, 2, 3])]
    c = compare(w, base, faulted)
    assert (c.greedy_compared, c.seeded_compared) == (3, 1)
    assert (c.greedy_differ, c.seeded_differ) == (1, 1)
    assert {(d.index, d.sampled, d.first_index) for d in c.differences} == {(1, True, 1), (2, False, 2)}
    assert {(d.index, d.tokens, d.prefix) for d in c.differences} == {(1, (2, 9), (1,)), (2, (3, 4), (1, 2))}


def test_an_output_that_ends_where_the_other_goes_on_has_no_tokens_to_judge():
    w = workload(sampled=set(), n=1)
    longer = record(0, [0.0, 1.0, 2.0], tokens=[1, 2, 3], max_tokens=2)
    (d,) = compare(w, [record(0, [0.0, 1.0], tokens=[1, 2])], [longer]).differences
    assert (d.first_index, d.tokens, d.prefix) == (2, None, (1, 2))


def test_a_request_lost_in_the_baseline_is_not_compared():
    w = workload(sampled=set(), n=2)
    base = [record(0, [0.0], status="INTERNAL", tokens=[5]), record(1, [0.0, 1.0], tokens=[1, 2])]
    c = compare(w, base, [record(0, [0.0], tokens=[7]), record(1, [0.0, 1.0], tokens=[1, 2])])
    assert (c.greedy_compared, c.differences) == (1, ())


def test_the_split_is_also_given_per_priority_class_present():
    vip = replace(record(0, [0.0, 1.0, 12.0]), priority="vip")
    batch = replace(record(1, [0.0, 30.0]), priority="batch")
    split = split_tbt([vip, batch], (Window(11.0, 12.0),))
    classes = dict(split.by_priority)
    assert list(classes) == ["vip", "batch"]
    assert classes["vip"].during.max == pytest.approx(11.0) and classes["vip"].outside.max == pytest.approx(1.0)
    assert classes["batch"].during.max == pytest.approx(30.0) and classes["batch"].outside is None
