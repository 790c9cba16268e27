"""Property-based fuzzing of every RPC against a real fleet (1 prefill, 1 decode, router).

Each example sends one RPC a random message, a valid message with fields mutated, or its bytes
garbled, with the right credentials or not, malformed trace context or none, and a generous or
tiny deadline. Every answer must be a documented status and no process may exit; after each
test every process is SERVING, the canary's greedy output is what it was, and no worker holds
a block. Undecodable bytes and the inputs the fuzzing found: tests/fuzz/test_fuzz_found.py.
"""

from __future__ import annotations

from contextlib import nullcontext

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import worker_pb2 as wpb
from tests.fuzz.calls import TINY_DEADLINE_S, Call, Outcome, assert_answered, invoke, read
from tests.fuzz.fleet import FuzzFleet, assert_came_through
from tests.fuzz.inputs import CREDENTIALS, metadata, rendered, trace_metadata
from tests.fuzz.rpcs import (BY_METHOD, COMPLETE, GENERATE, PROMPT, PUSH, RPCS, Ids, Reserved, Rpc, kv_complete,
                             kv_piece, reservation)
from tests.fuzz.strategies import Payload, payloads

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz, pytest.mark.timeout(600)]

FUZZ = settings(max_examples=30, derandomize=True, deadline=None, database=None, print_blob=False,
                phases=(Phase.explicit, Phase.generate),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
EXAMPLES = {"Generation.Generate.token_ids": 80, "Generation.Generate.text": 60, "Generation.Generate.messages": 60,
            "PrefillWorker.Prefill": 80, "DecodeWorker.Decode": 60}
WORKER_ABORT, PREFILL = "/pdserve.v1.DecodeWorker/Abort", "/pdserve.v1.PrefillWorker/Prefill"
ABORT = "/pdserve.v1.Generation/Abort"


@pytest.mark.parametrize("rpc", RPCS, ids=lambda rpc: rpc.name)
def test_every_answer_is_documented_and_the_fleet_comes_through(rpc: Rpc, live_fleet: FuzzFleet, channels):
    ids = Ids()

    @settings(FUZZ, max_examples=EXAMPLES.get(rpc.name, FUZZ.max_examples))
    @given(payload=payloads(rpc.request.DESCRIPTOR), credentials=st.sampled_from(CREDENTIALS),
           trace=trace_metadata(), timeout_s=st.sampled_from((rpc.deadline_s,) * 5 + (TINY_DEADLINE_S,)))
    def fuzz(payload: Payload, credentials: str, trace: tuple, timeout_s: float) -> None:
        held = reservation(channels["decode"], live_fleet.internal_metadata, ids) if rpc.needs_reservation \
            else nullcontext()
        with held as reserved:
            call = Call(live_fleet.address(rpc.role), rpc.method, rendered(rpc, payload, rpc.valid(ids, reserved)),
                        metadata(credentials, live_fleet, rpc) + trace, timeout_s, rpc.stream)
            outcome = invoke(channels[rpc.role], call, rpc.max_responses)
        assert_answered(call, outcome, rpc.may_wait)
        assert not live_fleet.dead(), f"{call} killed {live_fleet.dead()}"

    fuzz()
    assert_came_through(live_fleet)


def _kv_valid(rpc: Rpc, ids: Ids, reserved: Reserved, pushed: int) -> Message:
    """The next valid call on `reserved` after `pushed` accepted pieces."""
    if rpc.method == PUSH:
        return kv_piece(reserved.target, pushed)
    if rpc.method == COMPLETE:
        return kv_complete(reserved.target, pushed)
    if rpc.method == WORKER_ABORT:
        return wpb.WorkerAbortRequest(request_id=reserved.request_id)
    return rpc.valid(ids, reserved)


@st.composite
def _kv_steps(draw) -> list[tuple[Rpc, Payload]]:
    kinds = (PUSH, PUSH, PUSH, COMPLETE, COMPLETE, PREFILL, PREFILL, WORKER_ABORT)
    methods = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=4))
    return [(BY_METHOD[m], draw(payloads(BY_METHOD[m].request.DESCRIPTOR, as_is=True))) for m in methods]


def test_kv_calls_in_any_order_on_one_reservation(live_fleet: FuzzFleet, channels):
    """PushKV, CompleteKV, a real Prefill into the same reservation and an Abort of its request,
    valid or fuzzed, in any order: every answer is documented, and nothing of the transfer
    outlives the reservation."""
    ids = Ids()

    @settings(FUZZ, max_examples=60)
    @given(steps=_kv_steps())
    def fuzz(steps: list[tuple[Rpc, Payload]]) -> None:
        with reservation(channels["decode"], live_fleet.internal_metadata, ids) as reserved:
            pushed = 0
            for rpc, payload in steps:
                call = Call(live_fleet.address(rpc.role), rpc.method,
                            rendered(rpc, payload, _kv_valid(rpc, ids, reserved, pushed)),
                            live_fleet.internal_metadata, rpc.deadline_s, rpc.stream)
                outcome = invoke(channels[rpc.role], call, rpc.max_responses)
                pushed += rpc.method == PUSH and outcome.code == grpc.StatusCode.OK
                assert_answered(call, outcome, rpc.may_wait)
        assert not live_fleet.dead(), f"killed {live_fleet.dead()}"

    fuzz()
    assert_came_through(live_fleet)


def test_abort_racing_its_generate(live_fleet: FuzzFleet, channels):
    """An Abort, valid or fuzzed, after 0-2 messages of a running Generate: both calls answer
    with documented statuses, and the stream ends."""
    ids = Ids()
    abort = BY_METHOD[ABORT]

    @settings(FUZZ, max_examples=30)
    @given(payload=payloads(pb.AbortRequest.DESCRIPTOR, as_is=True), read_first=st.integers(0, 2))
    def fuzz(payload: Payload, read_first: int) -> None:
        request_id = ids.next("raced")
        generate = pb.GenerateRequest(request_id=request_id, token_ids=pb.TokenIds(ids=PROMPT),
                                      sampling=pb.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
        started = Call(live_fleet.router, GENERATE, generate.SerializeToString(), live_fleet.public_metadata,
                       stream=True)
        stream = channels["router"].unary_stream(GENERATE)(started.payload, metadata=started.metadata,
                                                           timeout=started.timeout_s)
        try:
            first = read(stream, read_first, cancel=False) if read_first else Outcome(grpc.StatusCode.OK, cut=True)
            call = Call(live_fleet.router, ABORT, rendered(abort, payload, pb.AbortRequest(request_id=request_id)),
                        live_fleet.public_metadata)
            assert_answered(call, invoke(channels["router"], call))
            assert_answered(started, read(stream, 1000) if first.cut else first)
        finally:
            stream.cancel()

    fuzz()
    assert_came_through(live_fleet)
