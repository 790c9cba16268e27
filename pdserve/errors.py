"""The errors a request can end with, raised by the engine, the workers and the router alike;
pdserve/rpc/errors.py maps each to its gRPC status code. No dependencies, so every process
(the router's included) imports them without the engine."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """The request can never be served as given (maps to INVALID_ARGUMENT)."""


class DuplicateRequestError(ValueError):
    """A request with this id is already running (maps to ALREADY_EXISTS)."""


class OverloadedError(RuntimeError):
    """Queues are full (maps to RESOURCE_EXHAUSTED). `retry_after_s`, when known: when trying
    again may find room (gRPC: trailing metadata `grpc-retry-pushback-ms`; HTTP: `Retry-After`)."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class IncompatibleError(RuntimeError):
    """Two workers that must not exchange KV were paired: their identities differ (maps to
    FAILED_PRECONDITION; the router places the request on a compatible pair)."""


class ChecksumMismatch(RuntimeError):
    """KV landed other than its sender summed it (pdserve/transfer/checksum.py): nothing of it may
    be used (maps to DATA_LOSS, naming the sender as the cause)."""


class CorruptKV(RuntimeError):
    """KV this worker sent arrived other than it summed it (the receiver's checksums differ):
    this worker's fault (maps to DATA_LOSS; the router retries the request elsewhere)."""


class EngineFailed(RuntimeError):
    """The engine of this process stopped (a fault in a step, or shutdown): nothing more can run
    here, so callers retry on another worker (maps to UNAVAILABLE)."""


class ClientAborted(RuntimeError):
    """Its client aborted the request, through whichever router (maps to ABORTED): it ends with
    finish reason ABORT, and no one retries it."""


class RequestFailed(RuntimeError):
    """The engine aborted this request because a step failed on it; other requests go on."""


class PeerFault(RuntimeError):
    """The request failed because of the peer worker this one works with, not this one: a prefill
    worker whose decode worker refused, dropped or timed out a KV piece. The stream ends with
    UNAVAILABLE and trailing metadata `pdserve-fault: <peer>`, so the router charges the peer."""

    def __init__(self, message: str, peer: str = "decode"):
        super().__init__(message)
        self.peer = peer
