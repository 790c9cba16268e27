"""Wire <-> core conversions: unset optional fields take the documented defaults."""

from __future__ import annotations

import grpc
import pytest

from pdserve.errors import InvalidRequestError
from pdserve.requests import FinishReason, Priority, SamplingParams
from pdserve.rpc.convert import (
    WireError,
    finish_from_pb,
    finish_to_pb,
    priority_from_pb,
    sampling_from_pb,
    sampling_to_pb,
)
from pdserve.rpc.errors import status_of
from pdserve.v1 import generation_pb2 as pb


def test_unset_fields_take_defaults_and_set_ones_survive_a_round_trip():
    assert sampling_from_pb(pb.SamplingParams()) == SamplingParams()
    params = SamplingParams(max_tokens=7, temperature=0.0, top_p=0.5, top_k=3, min_p=0.25, seed=2**63,
                            stop=("x",), stop_token_ids=(4,), ignore_eos=True)
    assert sampling_from_pb(sampling_to_pb(params)) == params


def test_zero_temperature_set_explicitly_is_greedy_not_default():
    assert sampling_from_pb(pb.SamplingParams(temperature=0.0)).greedy


def test_priorities_and_finish_reasons():
    assert priority_from_pb(pb.PRIORITY_UNSPECIFIED) == Priority.NORMAL
    assert priority_from_pb(pb.PRIORITY_VIP) == Priority.VIP
    with pytest.raises(WireError, match="unknown priority"):
        priority_from_pb(9)
    for reason in FinishReason:
        assert finish_from_pb(finish_to_pb(reason)) == reason


def test_errors_map_to_status_codes():
    assert status_of(WireError("x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_of(InvalidRequestError("x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_of(RuntimeError("x")) == grpc.StatusCode.INTERNAL
