"""What the fuzz tests send besides the message: credentials and trace metadata."""

from __future__ import annotations

from google.protobuf.message import DecodeError, Message
from hypothesis import strategies as st

from tests.fuzz.fleet import NORMAL_TOKEN, FuzzFleet
from tests.fuzz.rpcs import Rpc
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


def rendered(rpc: Rpc, payload: Payload, valid: Message) -> bytes:
    """What `payload` makes of `valid`, as long as it parses (else `valid` as is: undecodable
    bytes have tests of their own)."""
    data = payload.render(valid)
    return data if parses(rpc, data) else valid.SerializeToString()


def parses(rpc: Rpc, data: bytes) -> bool:
    try:
        rpc.request.FromString(data)
    except DecodeError:
        return False
    return True
