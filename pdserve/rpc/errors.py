"""Exceptions to gRPC status codes, once, as a server interceptor.

Handlers raise core exceptions; this maps them. A PeerFault also names the peer that caused it
in trailing metadata (`pdserve-fault: decode`), so the caller charges that peer. A handler that
already aborted with a status passes through untouched. Request bytes that do not parse reach
the handler as an `Undecodable` and are answered INVALID_ARGUMENT (grpc itself would say UNKNOWN). Anything unexpected becomes INTERNAL with its message, logged once,
and the server keeps serving everyone else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

import grpc

from pdserve.errors import (ChecksumMismatch, ClientAborted, CorruptKV, DuplicateRequestError, EngineFailed,
                            IncompatibleError, InvalidRequestError, OverloadedError, PeerFault)
from pdserve.rpc.convert import WireError
from pdserve.tokenizer.base import ChatTemplateError

log = logging.getLogger(__name__)
FAULT_METADATA = "pdserve-fault"  # trailing metadata naming the peer that caused a failure
NOBODY = "nobody"  # FAULT_METADATA of a request given back (Withdrawn): no one is charged
SENDER = "sender"  # FAULT_METADATA of KV that landed other than its sender summed it: the sender is charged
ATTACHED = "attached"  # FAULT_METADATA of a call whose request another router attached: it goes on there
RETRY_METADATA = "grpc-retry-pushback-ms"  # when to try again (gRFC A6's server pushback), milliseconds


class Unavailable(RuntimeError):
    """No worker can take the request now, or the one serving it died (maps to UNAVAILABLE).
    `retry_after_s`, when known: when trying again may find one (sent as OverloadedError's is)."""

    def __init__(self, message: str = "", retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Withdrawn(Unavailable):
    """This worker gives the request back (it is leaving its role): another should take it, and
    nobody is to blame (UNAVAILABLE with trailing metadata `pdserve-fault: nobody`)."""


class FeedClosed(Unavailable):
    """A router's event feed ended (its router went away, or let the feed go): the requests on it
    lose their reader, not their life (a reattachable one is orphaned: decode_service/orphans.py)."""


class NotFound(RuntimeError):
    """What the request names is not there (maps to NOT_FOUND): a stream to continue that no
    worker holds, and whose tokens the client did not send."""


class TakenOver(ClientAborted):
    """Another router attached the request (Attach): this call no longer drives it (ABORTED with
    trailing metadata `pdserve-fault: attached`)."""


class Unauthenticated(RuntimeError):
    """Missing or wrong credentials (maps to UNAUTHENTICATED)."""


class PermissionDenied(RuntimeError):
    """The caller may not do what the request asks, e.g. a priority above its tenant's (maps to
    PERMISSION_DENIED)."""


STATUS_OF: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (DuplicateRequestError, grpc.StatusCode.ALREADY_EXISTS),
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (ChatTemplateError, grpc.StatusCode.INVALID_ARGUMENT),
    (WireError, grpc.StatusCode.INVALID_ARGUMENT),
    (OverloadedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (IncompatibleError, grpc.StatusCode.FAILED_PRECONDITION),
    (ChecksumMismatch, grpc.StatusCode.DATA_LOSS),
    (CorruptKV, grpc.StatusCode.DATA_LOSS),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (PeerFault, grpc.StatusCode.UNAVAILABLE),
    (EngineFailed, grpc.StatusCode.UNAVAILABLE),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (ClientAborted, grpc.StatusCode.ABORTED),
    (NotFound, grpc.StatusCode.NOT_FOUND),
)


def status_of(exc: BaseException) -> grpc.StatusCode:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code()
    for kind, code in STATUS_OF:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


class Failure(NamedTuple):
    """What a handler's exception becomes on the wire. Only this outlives the except block: the
    exception's traceback holds the request (and its arena), so aborting while it is alive
    would tie the request into a cycle that waits for the garbage collector."""

    code: grpc.StatusCode
    details: str
    peer: str | None  # a PeerFault's culprit, sent as trailing metadata
    retry_after_s: float | None = None  # the refusal's hint (retry_after_of), sent as RETRY_METADATA

    def end(self, context: grpc.aio.ServicerContext) -> None:
        """Sets the call's status; the handler then returns (no AbortError, whose traceback
        would hold the handler's frame and the request in it)."""
        trailers = []
        if self.peer is not None:
            trailers.append((FAULT_METADATA, self.peer))
        if self.retry_after_s is not None:
            trailers.append((RETRY_METADATA, str(max(0, round(self.retry_after_s * 1000)))))
        if trailers:
            context.set_trailing_metadata(tuple(trailers))
        context.set_code(self.code)
        context.set_details(self.details)


def failure_of(exc: Exception) -> Failure:
    code = status_of(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("unexpected error in handler", exc_info=exc)
    details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    peer = exc.peer if isinstance(exc, PeerFault) else NOBODY if isinstance(exc, Withdrawn) else \
        SENDER if isinstance(exc, ChecksumMismatch) else ATTACHED if isinstance(exc, TakenOver) else None
    return Failure(code, bounded(details or type(exc).__name__), peer, retry_after_of(exc))


MAX_DETAILS = 2048  # characters of a status message: the trailers must stay under gRPC's 8 KB limit


def bounded(details: str) -> str:
    """A status message cut to MAX_DETAILS (an error may quote a request's ids: never all of them)."""
    return details if len(details) <= MAX_DETAILS else details[:MAX_DETAILS - 16] + " ... (cut)"


def retry_after_of(exc: BaseException) -> float | None:
    """When trying again may succeed, for a refusal that knows (full queues, no worker now)."""
    return exc.retry_after_s if isinstance(exc, (OverloadedError, Unavailable)) else None


class Undecodable:
    """A request whose bytes did not parse; the handler refuses it before the servicer sees it."""

    def __init__(self, error: Exception) -> None:
        self.reason = str(error)[:200] or type(error).__name__  # the text only: the error holds the bytes

    def refusal(self) -> WireError:
        return WireError(f"the request does not parse: {self.reason}")


def _lenient(deserialize: Callable | None) -> Callable | None:
    if deserialize is None:
        return None

    def parse(data: bytes):
        try:
            return deserialize(data)
        except Exception as exc:  # protobuf's DecodeError, or a string field that is not UTF-8
            return Undecodable(exc)

    return parse


class _Ends:
    """`with _Ends(context):` around a handler's body: an exception from it ends the call with
    its Failure, an abort passes through, cancellation (not an Exception) propagates."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self.context = context

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> bool:
        if not isinstance(exc, Exception) or isinstance(exc, grpc.aio.AbortError):
            return False
        failure_of(exc).end(self.context)
        return True


def _parsed(request):
    if isinstance(request, Undecodable):
        raise request.refusal()
    return request


def _wrap_unary(fn: Callable) -> Callable:
    async def handler(request, context):
        with _Ends(context):
            return await fn(_parsed(request), context)

    return handler


def _wrap_stream(fn: Callable) -> Callable:
    async def handler(request, context):
        with _Ends(context):
            async for item in fn(_parsed(request), context):
                yield item

    return handler


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary), _lenient(handler.request_deserializer), handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream), _lenient(handler.request_deserializer),
                handler.response_serializer)
        return handler
