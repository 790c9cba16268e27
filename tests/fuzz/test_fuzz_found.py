"""What the fuzzing found, each kept with the smallest input that showed it: a huge piece count
(it built a list of that size), a huge unknown transfer id (quoted whole, the trailers overflowed),
bytes that do not parse as the request type (grpc answered UNKNOWN), and reservations whose KV
address was damaged (UCX connected to some and failed inside, and a prefill worker later died of
SIGSEGV): the decode worker now confirms every address in PushKV, before a byte is sent."""

from __future__ import annotations

import grpc
import pytest

from tests.fuzz.calls import Call, assert_answered, invoke
from tests.fuzz.fleet import FuzzFleet, assert_came_through
from tests.fuzz.inputs import metadata, parses
from tests.fuzz.rpcs import BY_METHOD, COMPLETE, METHODS, PUSH, Ids, Rpc, kv_complete, reservation

PREFILL = "/pdserve.v1.PrefillWorker/Prefill"

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz, pytest.mark.timeout(600)]

UNDECODABLE = (b"\xff\xff\xff", b"\x08", b"\x0a\x05ab", b"\x0f", b"\x07\x00",
               b"\x0a\x02\xff\xfe")  # the last: not UTF-8 where field 1 is a string


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


def test_a_prefill_into_a_damaged_kv_address_is_refused_before_a_byte_is_sent(live_fleet: FuzzFleet, channels):
    ids, rpc = Ids(), BY_METHOD[PREFILL]
    for position in range(0, 200, 9):  # through the address's header, its devices and their addresses
        with reservation(channels["decode"], live_fleet.internal_metadata, ids) as reserved:
            message = rpc.valid(ids, reserved)
            address = bytearray(message.target.kv_address)
            if position >= len(address):
                break
            address[position] ^= 0x30
            message.target.kv_address = bytes(address)
            call = Call(live_fleet.prefill, PREFILL, message.SerializeToString(), metadata("good", live_fleet, rpc),
                        rpc.deadline_s, rpc.stream)
            outcome = invoke(channels["prefill"], call, rpc.max_responses)
        assert not live_fleet.dead(), f"a flipped byte {position} of the KV address killed {live_fleet.dead()}"
        assert_answered(call, outcome)
        # refused by the decode worker's PushKV before the transport saw the address (UCX itself
        # accepts some damaged ones); the prefill worker's stream ends as for any refusing peer
        assert "is not one of this decode worker's receivers" in outcome.details, (position, outcome)
    assert_came_through(live_fleet)


def _send_undecodable(fleet: FuzzFleet, channels, rpc: Rpc) -> dict[bytes, str]:
    """Each payload of UNDECODABLE that does not parse as `rpc`'s request: the status it got."""
    codes = {}
    for payload in (p for p in UNDECODABLE if not parses(rpc, p)):
        call = Call(fleet.address(rpc.role), rpc.method, payload, metadata("good", fleet, rpc), rpc.deadline_s,
                    rpc.stream)
        codes[payload] = invoke(channels[rpc.role], call, rpc.max_responses).code.name
    return codes


def test_undecodable_bytes_leave_every_process_serving(live_fleet: FuzzFleet, channels):
    for rpc in METHODS:
        _send_undecodable(live_fleet, channels, rpc)
        assert not live_fleet.dead(), f"undecodable bytes to {rpc.method} killed {live_fleet.dead()}"
    assert_came_through(live_fleet)


@pytest.mark.parametrize("rpc", METHODS, ids=lambda rpc: rpc.method.rsplit(".", 1)[-1].replace("/", "."))
def test_undecodable_bytes_are_invalid_argument(rpc: Rpc, live_fleet: FuzzFleet, channels):
    codes = _send_undecodable(live_fleet, channels, rpc)
    assert set(codes.values()) == {"INVALID_ARGUMENT"}, codes
