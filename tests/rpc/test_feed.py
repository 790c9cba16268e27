"""A worker's event feed on the wire (pdserve/rpc/feed.py): read back as the router reads it
(router/fleet/grpc_feed.py: a message's token runs first, then its events), every request's events
are the batch's, in order, whether the router asked for token runs or not, and however the
batch is split into messages."""

from __future__ import annotations

import pytest

from pdserve.requests import FinishReason, TokenLogprobs
from pdserve.rpc import feed
from pdserve.rpc.convert import logprobs_to_pb
from pdserve.v1 import worker_pb2 as wpb
from pdserve.worker.events import Finished, Preempted, Tokens
from router.fleet.grpc_wire import decode_event
from decode_service.servicer import token_run

pytestmark = pytest.mark.timeout(30)

LOGPROBS = TokenLogprobs(5, -0.25, ())


def _to_pb(event) -> wpb.DecodeEvent:
    if isinstance(event, Tokens):
        return wpb.DecodeEvent(tokens=wpb.DecodeTokens(token_ids=list(event.token_ids),
                                                       logprobs=[logprobs_to_pb(lp) for lp in event.logprobs]))
    if isinstance(event, Preempted):
        return wpb.DecodeEvent(preempted=wpb.PreemptionNotice(mode=event.mode, reason=event.reason, phase=event.phase))
    return wpb.DecodeEvent(finished=wpb.DecodeFinished(finish_reason=1))


def _read_back(messages) -> dict[str, list]:
    """Each request's events as the router's feed reader takes them."""
    seen: dict[str, list] = {}
    for message in messages:
        at = 0
        for request_id, length in zip(message.run_request_ids, message.run_lengths):
            seen.setdefault(request_id, []).append(Tokens(tuple(message.run_token_ids[at:at + length])))
            at += length
        assert at == len(message.run_token_ids)
        for item in message.events:
            seen.setdefault(item.request_id, []).append(decode_event(item.event))
    return seen


BATCH = {
    "a": [Tokens((1, 2)), Finished(FinishReason.LENGTH, 0, 0)],
    "b": [Preempted("recompute", "out_of_blocks", "preempted"), Tokens((3,)), Preempted("", "", "resumed")],
    "c": [Tokens((4,), (LOGPROBS,))],  # log-probabilities: never a run
    "d": [Tokens((6, 7, 8))],
}


def _finished_of(events: list) -> list:
    """Finished as the wire carries it (its reason; counts that the test's encoder leaves 0)."""
    return [Finished(FinishReason.LENGTH, 0, 0) if isinstance(e, Finished) else e for e in events]


@pytest.mark.parametrize("runs", [False, True])
def test_every_requests_events_read_back_in_order(runs):
    messages = list(feed.fed_batches_to_pb(BATCH, _to_pb, token_run if runs else None))
    assert len(messages) == 1
    assert _read_back(messages) == {k: _finished_of(v) for k, v in BATCH.items()}
    assert list(messages[0].run_request_ids) == (["a", "d"] if runs else [])


def test_a_request_counts_one_event_per_run_as_per_fed_event():
    """What the worker counts for FedEvents.events (an event on the wire) is what arrives."""
    messages = list(feed.fed_batches_to_pb(BATCH, _to_pb, token_run))
    assert {k: len(v) for k, v in _read_back(messages).items()} == {k: len(v) for k, v in BATCH.items()}


def test_a_batch_past_the_token_budget_splits_keeping_each_requests_order(monkeypatch):
    monkeypatch.setattr(feed, "MESSAGE_TOKENS", 3)
    messages = list(feed.fed_batches_to_pb(BATCH, _to_pb, token_run))
    assert len(messages) > 1
    assert _read_back(messages) == {k: _finished_of(v) for k, v in BATCH.items()}
