"""Logprobs over the wire: sampling.logprobs router -> workers, and each worker's logprobs back
into the router's worker-client events (float32 on the wire)."""

from __future__ import annotations

import pytest

from pdserve.requests import SamplingParams
from pdserve.rpc.convert import logprobs_from_pb, logprobs_to_pb, sampling_from_pb, sampling_to_pb
from pdserve.sampling import TokenLogprobs
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import worker_pb2 as wpb
from pdserve.worker.events import FirstToken, Tokens
from prefill_service.servicer import _event_to_pb as prefill_event_to_pb
from router.fleet.grpc_wire import decode_event, prefill_event

LP = TokenLogprobs(7, -0.25, ((7, -0.25), (3, -1.5)))  # exact in float32


@pytest.mark.parametrize("k", [None, 0, 5, 20])
def test_sampling_logprobs_survive_the_wire_and_unset_stays_unset(k):
    params = SamplingParams(temperature=0.0, logprobs=k)
    msg = sampling_to_pb(params)
    assert msg.HasField("logprobs") == (k is not None)
    assert sampling_from_pb(msg) == params
    assert sampling_from_pb(pb.SamplingParams()).logprobs is None


def test_token_logprobs_round_trip():
    assert logprobs_from_pb(logprobs_to_pb(LP)) == LP
    assert logprobs_from_pb(logprobs_to_pb(TokenLogprobs(1, -2.0))) == TokenLogprobs(1, -2.0)
    rounded = logprobs_from_pb(logprobs_to_pb(TokenLogprobs(1, -0.1, ((1, -0.1),))))
    assert rounded.logprob == pytest.approx(-0.1, abs=1e-7) and rounded.top[0][1] == rounded.logprob


def test_decode_tokens_carry_aligned_logprobs():
    second = TokenLogprobs(9, -3.0)
    event = wpb.DecodeEvent(tokens=wpb.DecodeTokens(token_ids=[7, 9],
                                                    logprobs=[logprobs_to_pb(LP), logprobs_to_pb(second)]))
    assert decode_event(event) == Tokens((7, 9), (LP, second))
    assert decode_event(wpb.DecodeEvent(tokens=wpb.DecodeTokens(token_ids=[7]))) == Tokens((7,))


def test_the_prefill_workers_first_token_carries_its_logprobs_when_asked():
    asked = prefill_event_to_pb(FirstToken(7, 0, 10, 1, 1, 0.5, 0.0, LP))
    silent = prefill_event_to_pb(FirstToken(7, 0, 10, 1, 1, 0.5, 0.0))
    assert not silent.done.HasField("first_token_logprobs")
    first = prefill_event(asked)
    assert isinstance(first, FirstToken) and (first.token_id, first.logprobs) == (7, LP)
    assert prefill_event(silent).logprobs is None
