"""Property-based fuzzing of every RPC against a real fleet (1 prefill, 1 decode, router).

Each example sends one RPC a random message, a valid message with fields mutated, or its bytes
garbled, with the right credentials or not and a generous or tiny deadline. Every answer must
be a documented status and no process may exit; after each RPC's examples every process is
SERVING, the canary's greedy output is what it was, and no worker holds a block.

Bytes that do not parse as the request type are tested on their own (their status comes from
grpc's deserializer, not from the servicers). Inputs of a known, reported bug (KNOWN_BUGS) are
left out of the fuzzing and reproduced by an expected failure of their own, which turns into a
failure once the bug is fixed (then drop both).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from pdserve.v1 import worker_pb2 as wpb
from tests.fuzz.calls import TINY_DEADLINE_S, Call, assert_answered, invoke
from tests.fuzz.fleet import NORMAL_TOKEN, FuzzFleet, assert_came_through
from tests.fuzz.rpcs import RPCS, Ids, Reserved, Rpc, kv_complete, kv_piece, reservation
from tests.fuzz.strategies import Payload, payloads

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz, pytest.mark.timeout(600)]

FUZZ = settings(max_examples=30, derandomize=True, deadline=None, database=None, print_blob=False,
                phases=(Phase.explicit, Phase.generate),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
EXAMPLES = {"/pdserve.v1.Generation/Generate": 150, "/pdserve.v1.PrefillWorker/Prefill": 80,
            "/pdserve.v1.DecodeWorker/Decode": 60}
PUSH, COMPLETE, ABORT = ("/pdserve.v1.DecodeWorker/PushKV", "/pdserve.v1.DecodeWorker/CompleteKV",
                         "/pdserve.v1.DecodeWorker/Abort")
PREFILL = "/pdserve.v1.PrefillWorker/Prefill"
BY_METHOD = {rpc.method: rpc for rpc in RPCS}
CREDENTIALS = ("good",) * 9 + ("none", "wrong", "normal tenant", "not bearer", "long")
TRACEPARENTS = ("", "00-", "zz-" + "g" * 32 + "-" + "h" * 16 + "-01", "00-" + "0" * 32 + "-" + "0" * 16 + "-00",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff",
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "x" * 8000)
TRACESTATES = ("", "a=b", "=,=,", "k" * 600)


@dataclass(frozen=True)
class KnownBug:
    methods: tuple[str, ...]
    hits: Callable[[Message], bool]
    reason: str


KNOWN_BUGS = (
    KnownBug((COMPLETE,), lambda m: m.num_pieces > 1 << 20,
             "CompleteKV with a huge num_pieces (e.g. 4294967295) on a live transfer builds list(range(num_pieces)) "
             "in decode_service/intake.py check_complete: MemoryError, answered INTERNAL (unbounded, 2**31 takes "
             "the machine's memory)"),
    KnownBug((PUSH, COMPLETE), lambda m: len(m.transfer_id) > 8192,
             "PushKV and CompleteKV with an unknown transfer_id of 300,000 characters are refused with a message "
             "quoting the whole id (decode_service/servicer.py _authorize, worker.py _intake_of): the trailers "
             "exceed the client's 16 KiB limit, which answers RESOURCE_EXHAUSTED instead of PERMISSION_DENIED or "
             "INVALID_ARGUMENT"),
)


def _rendered(rpc: Rpc, payload: Payload, valid: Message) -> bytes:
    """What `payload` makes of `valid`, as long as it parses (else `valid` as is) and is no
    known bug's input."""
    data = payload.render(valid)
    try:
        sent = rpc.request.FromString(data)
    except DecodeError:
        return valid.SerializeToString()
    assume(not any(rpc.method in bug.methods and bug.hits(sent) for bug in KNOWN_BUGS))
    return data


def _metadata(choice: str, fleet: FuzzFleet, rpc: Rpc) -> tuple[tuple[str, str], ...]:
    good = fleet.public_metadata if rpc.role == "router" else fleet.internal_metadata
    return {"good": good, "none": (), "wrong": (("authorization", "Bearer nope"),),
            "normal tenant": (("authorization", f"Bearer {NORMAL_TOKEN}"),),
            "not bearer": (("authorization", "Basic dXNlcjpwYXNz"),),
            "long": (("authorization", "Bearer " + "t" * 7000),)}[choice]


@st.composite
def _trace_metadata(draw) -> tuple[tuple[str, str], ...]:
    """Mostly none; else a traceparent and a tracestate, most of them malformed."""
    if draw(st.integers(0, 3)):
        return ()
    return (("traceparent", draw(st.sampled_from(TRACEPARENTS))), ("tracestate", draw(st.sampled_from(TRACESTATES))))


def _name(rpc: Rpc) -> str:
    return rpc.method.rsplit(".", 1)[-1].replace("/", ".")


@pytest.mark.parametrize("rpc", RPCS, ids=_name)
def test_every_answer_is_documented_and_the_fleet_comes_through(rpc: Rpc, live_fleet: FuzzFleet, channels):
    ids = Ids()

    @settings(FUZZ, max_examples=EXAMPLES.get(rpc.method, FUZZ.max_examples))
    @given(payload=payloads(rpc.request.DESCRIPTOR), credentials=st.sampled_from(CREDENTIALS),
           trace=_trace_metadata(), timeout_s=st.sampled_from((rpc.deadline_s,) * 5 + (TINY_DEADLINE_S,)))
    def fuzz(payload: Payload, credentials: str, trace: tuple, timeout_s: float) -> None:
        held = reservation(channels["decode"], live_fleet.internal_metadata, ids) if rpc.needs_reservation \
            else nullcontext()
        with held as reserved:
            call = Call(live_fleet.address(rpc.role), rpc.method, _rendered(rpc, payload, rpc.valid(ids, reserved)),
                        _metadata(credentials, live_fleet, rpc) + trace, timeout_s, rpc.stream)
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
    if rpc.method == ABORT:
        return wpb.WorkerAbortRequest(request_id=reserved.request_id)
    return rpc.valid(ids, reserved)


@st.composite
def _kv_steps(draw) -> list[tuple[Rpc, Payload]]:
    methods = draw(st.lists(st.sampled_from((PUSH, PUSH, PUSH, COMPLETE, COMPLETE, PREFILL, PREFILL, ABORT)),
                            min_size=1, max_size=4))
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
                            _rendered(rpc, payload, _kv_valid(rpc, ids, reserved, pushed)),
                            live_fleet.internal_metadata, rpc.deadline_s, rpc.stream)
                outcome = invoke(channels[rpc.role], call, rpc.max_responses)
                pushed += rpc.method == PUSH and outcome.code == grpc.StatusCode.OK
                assert_answered(call, outcome)
        assert not live_fleet.dead(), f"killed {live_fleet.dead()}"

    fuzz()
    assert_came_through(live_fleet)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=KNOWN_BUGS[1].reason)
@pytest.mark.parametrize("method", (PUSH, COMPLETE), ids=lambda m: m.rsplit("/", 1)[-1])
def test_a_huge_unknown_transfer_id_is_refused_in_a_few_words(method: str, live_fleet: FuzzFleet, channels):
    ids, rpc = Ids(), BY_METHOD[method]
    with reservation(channels["decode"], live_fleet.internal_metadata, ids) as reserved:
        message = rpc.valid(ids, reserved)
        message.transfer_id = "y" * 300_000
        call = Call(live_fleet.decode, method, message.SerializeToString(), live_fleet.internal_metadata)
        outcome = invoke(channels["decode"], call)
    assert not live_fleet.dead(), f"killed {live_fleet.dead()}"
    assert_answered(call, outcome)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=KNOWN_BUGS[0].reason)
def test_complete_kv_with_a_huge_piece_count_is_invalid_argument(live_fleet: FuzzFleet, channels):
    ids, codes = Ids(), []
    for num_pieces in (2**32 - 1, 2**31 + 7):
        with reservation(channels["decode"], live_fleet.internal_metadata, ids) as reserved:
            message = kv_complete(reserved.target, 0)
            message.num_pieces = num_pieces
            call = Call(live_fleet.decode, COMPLETE, message.SerializeToString(), live_fleet.internal_metadata)
            codes.append(invoke(channels["decode"], call).code)
    assert not live_fleet.dead(), f"killed {live_fleet.dead()}"
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 2, codes


UNDECODABLE = (b"\xff\xff\xff", b"\x08", b"\x0a\x05ab", b"\x0f", b"\x07\x00",
               b"\x0a\x02\xff\xfe")  # the last: not UTF-8 where field 1 is a string


def _send_undecodable(fleet: FuzzFleet, channels, rpc: Rpc) -> dict[bytes, str]:
    """Each payload of UNDECODABLE that does not parse as `rpc`'s request: the status it got."""
    codes = {}
    for payload in UNDECODABLE:
        try:
            rpc.request.FromString(payload)
            continue
        except DecodeError:
            pass
        call = Call(fleet.address(rpc.role), rpc.method, payload, _metadata("good", fleet, rpc), rpc.deadline_s,
                    rpc.stream)
        codes[payload] = invoke(channels[rpc.role], call, rpc.max_responses).code.name
    return codes


def test_undecodable_bytes_leave_every_process_serving(live_fleet: FuzzFleet, channels):
    for rpc in RPCS:
        _send_undecodable(live_fleet, channels, rpc)
        assert not live_fleet.dead(), f"undecodable bytes to {rpc.method} killed {live_fleet.dead()}"
    assert_came_through(live_fleet)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="a request whose bytes do not parse is answered UNKNOWN "
                   "('Unexpected DecodeError') by grpc's deserializer, before pdserve/rpc/errors.py maps anything: it "
                   "should be INVALID_ARGUMENT")
@pytest.mark.parametrize("rpc", RPCS, ids=_name)
def test_undecodable_bytes_are_invalid_argument(rpc: Rpc, live_fleet: FuzzFleet, channels):
    codes = _send_undecodable(live_fleet, channels, rpc)
    assert set(codes.values()) == {"INVALID_ARGUMENT"}, codes
