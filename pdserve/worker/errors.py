"""Why a worker ends a request's stream, where the servicers' status mapping needs to know."""

from __future__ import annotations


class PeerFault(RuntimeError):
    """The request failed because of the peer worker this one works with, not this one: a prefill
    worker whose decode worker refused, dropped or timed out a KV piece. The stream ends with
    UNAVAILABLE and trailing metadata `pdserve-fault: <peer>`, so the router charges the peer."""

    def __init__(self, message: str, peer: str = "decode"):
        super().__init__(message)
        self.peer = peer


class RequestFailed(RuntimeError):
    """The engine aborted this request because a step failed on it; other requests go on."""
