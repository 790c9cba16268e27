"""Calls with raw bytes on a generic channel (identity serializers), and what counts as an answer.

Every answer must be one of the documented statuses; INTERNAL and UNKNOWN mean a handler (or
the wire layer) failed on the input. DEADLINE_EXCEEDED is an answer only to a caller that gave
a tiny deadline, or on a stream that may rightly wait (a Decode stream waiting for its KV, a
Prefill opened with target_follows waiting for its reservation).
A server's trailers too big for the client to take (an error message echoing an input without
bound) are no answer either: the client sees RESOURCE_EXHAUSTED instead of what was meant.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

ANSWERS = frozenset({
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.FAILED_PRECONDITION,  # a reservation of another identity (pdserve/worker/decode_peer.py)
    grpc.StatusCode.NOT_FOUND,  # a continued stream (resume_from_token) nobody holds: generation.proto says so
})
OVERSIZED_TRAILERS = "Stream removed (received metadata size exceeds"  # the client's words for them
TINY_DEADLINE_S = 0.05
GENEROUS_DEADLINE_S = 30.0


@dataclass(frozen=True)
class Outcome:
    code: grpc.StatusCode
    details: str = ""
    responses: tuple[bytes, ...] = ()
    cut: bool = False  # the caller stopped reading and cancelled the stream


@dataclass(frozen=True)
class Call:
    """One RPC as sent: where, what, with which metadata and deadline."""

    address: str
    method: str
    payload: bytes
    metadata: tuple[tuple[str, str], ...] = ()
    timeout_s: float = GENEROUS_DEADLINE_S
    stream: bool = False

    def __repr__(self) -> str:
        return (f"Call({self.address}{self.method}, {len(self.payload)} bytes {self.payload[:48]!r}, "
                f"metadata={[k for k, _ in self.metadata]}, timeout={self.timeout_s})")


def invoke(channel: grpc.Channel, call: Call, max_responses: int = 4) -> Outcome:
    """Send `call` on `channel`; a stream is cancelled after `max_responses` messages."""
    try:
        if not call.stream:
            reply = channel.unary_unary(call.method)(call.payload, metadata=call.metadata, timeout=call.timeout_s)
            return Outcome(grpc.StatusCode.OK, responses=(reply,))
        return read(channel.unary_stream(call.method)(call.payload, metadata=call.metadata,
                                                      timeout=call.timeout_s), max_responses)
    except grpc.RpcError as exc:
        return Outcome(exc.code(), exc.details() or "")


def read(responses, max_responses: int, cancel: bool = True) -> Outcome:
    """Read an open stream to its end, or stop after `max_responses` (at least 1) messages and
    cancel it unless told not to."""
    got: list[bytes] = []
    try:
        for response in responses:
            got.append(response)
            if len(got) >= max_responses:
                if cancel:
                    responses.cancel()
                return Outcome(grpc.StatusCode.OK, responses=tuple(got), cut=True)
    except grpc.RpcError as exc:
        return Outcome(exc.code(), exc.details() or "", tuple(got))
    return Outcome(grpc.StatusCode.OK, responses=tuple(got))


def assert_answered(call: Call, outcome: Outcome, may_wait: bool = False) -> None:
    """The outcome is a documented answer to `call`."""
    allowed = set(ANSWERS)
    if call.timeout_s <= TINY_DEADLINE_S or may_wait:
        allowed.add(grpc.StatusCode.DEADLINE_EXCEEDED)
    assert outcome.code in allowed, f"{call} answered {outcome.code.name}: {outcome.details}"
    assert OVERSIZED_TRAILERS not in outcome.details, f"{call} answered with trailers too big: {outcome.details}"
