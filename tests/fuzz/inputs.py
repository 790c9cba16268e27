"""What the fuzz tests send besides the message: credentials and trace metadata; and the inputs
of known, reported bugs, which the fuzzing leaves out (tests/fuzz/test_fuzz_known_bugs.py
reproduces each as an expected failure, which fails once the bug is fixed: then drop both)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.message import DecodeError, Message
from hypothesis import assume
from hypothesis import strategies as st

from tests.fuzz.fleet import NORMAL_TOKEN, FuzzFleet
from tests.fuzz.rpcs import COMPLETE, PUSH, Rpc
from tests.fuzz.strategies import Payload

CREDENTIALS = ("good",) * 9 + ("none", "wrong", "normal tenant", "not bearer", "long")
TRACEPARENTS = ("", "00-", "zz-" + "g" * 32 + "-" + "h" * 16 + "-01", "00-" + "0" * 32 + "-" + "0" * 16 + "-00",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff",
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "x" * 8000)
TRACESTATES = ("", "a=b", "=,=,", "k" * 600)


def metadata(choice: str, fleet: FuzzFleet, rpc: Rpc) -> tuple[tuple[str, str], ...]:
    """Credentials by name: `good` ones for `rpc`'s port, or missing, wrong, of a tenant capped
    at NORMAL, of another scheme, or far too long."""
    good = fleet.public_metadata if rpc.role == "router" else fleet.internal_metadata
    return {"good": good, "none": (), "wrong": (("authorization", "Bearer nope"),),
            "normal tenant": (("authorization", f"Bearer {NORMAL_TOKEN}"),),
            "not bearer": (("authorization", "Basic dXNlcjpwYXNz"),),
            "long": (("authorization", "Bearer " + "t" * 7000),)}[choice]


@st.composite
def trace_metadata(draw) -> tuple[tuple[str, str], ...]:
    """Mostly none; else a traceparent and a tracestate, most of them malformed."""
    if draw(st.integers(0, 3)):
        return ()
    return (("traceparent", draw(st.sampled_from(TRACEPARENTS))), ("tracestate", draw(st.sampled_from(TRACESTATES))))


@dataclass(frozen=True)
class KnownBug:
    methods: tuple[str, ...]
    hits: Callable[[Message], bool]
    reason: str


HUGE_PIECE_COUNT = KnownBug(
    (COMPLETE,), lambda m: m.num_pieces > 1 << 20,
    "CompleteKV with a huge num_pieces (e.g. 4294967295) on a live transfer builds list(range(num_pieces)) in "
    "decode_service/intake.py check_complete: MemoryError, answered INTERNAL (and 2**31 takes the machine's memory "
    "without a limit on the process)")
QUOTED_TRANSFER_ID = KnownBug(
    (PUSH, COMPLETE), lambda m: len(m.transfer_id) > 8192,
    "PushKV and CompleteKV with an unknown transfer_id of 300,000 characters are refused with a message quoting "
    "the whole id (decode_service/servicer.py _authorize, worker.py _intake_of): the trailers exceed the client's "
    "16 KiB limit, which answers RESOURCE_EXHAUSTED instead of PERMISSION_DENIED or INVALID_ARGUMENT")
KNOWN_BUGS = (HUGE_PIECE_COUNT, QUOTED_TRANSFER_ID)


def rendered(rpc: Rpc, payload: Payload, valid: Message) -> bytes:
    """What `payload` makes of `valid`, as long as it parses (else `valid` as is: undecodable
    bytes have tests of their own) and is no known bug's input (else the example is dropped)."""
    data = payload.render(valid)
    if not parses(rpc, data):
        return valid.SerializeToString()
    sent = rpc.request.FromString(data)
    assume(not any(rpc.method in bug.methods and bug.hits(sent) for bug in KNOWN_BUGS))
    return data


def parses(rpc: Rpc, data: bytes) -> bool:
    try:
        rpc.request.FromString(data)
    except DecodeError:
        return False
    return True
