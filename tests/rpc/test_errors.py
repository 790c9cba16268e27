"""The error interceptor's handler wrappers: an exception ends the call with its status, unary
and streaming alike, and nothing of the refused request outlives the call (no cycle for the GC)."""

from __future__ import annotations

import asyncio
import gc
import weakref

import grpc
import pytest

from pdserve.errors import InvalidRequestError, PeerFault
from pdserve.rpc.errors import Undecodable, _wrap_stream, _wrap_unary


class Context:
    """What the wrappers set on a grpc.aio servicer context."""

    code = details = trailing = None

    def set_code(self, code):
        self.code = code

    def set_details(self, details):
        self.details = details

    def set_trailing_metadata(self, metadata):
        self.trailing = metadata


class Request:
    pass


async def _unary_refusing(request, context):
    raise InvalidRequestError("too big")


async def _stream_refusing(request, context):
    yield "first"
    raise InvalidRequestError("too big")


async def _call(wrapped, request, context):
    handler = wrapped(request, context)  # a coroutine (unary) or an async generator (stream)
    if hasattr(handler, "__aiter__"):
        return [item async for item in handler]
    return await handler


@pytest.mark.parametrize("wrap,fn", [(_wrap_unary, _unary_refusing), (_wrap_stream, _stream_refusing)],
                         ids=["unary", "stream"])
def test_a_refusal_sets_the_status_and_frees_the_request_without_the_gc(wrap, fn):
    request, context = Request(), Context()
    alive = weakref.ref(request)
    gc.disable()
    try:
        asyncio.run(_call(wrap(fn), request, context))
        del request
        assert alive() is None, "the refused request is held by a reference cycle"
    finally:
        gc.enable()
    assert (context.code, context.details) == (grpc.StatusCode.INVALID_ARGUMENT, "too big")


def test_undecodable_bytes_are_refused_before_the_handler_and_a_peer_is_named():
    async def never(request, context):
        raise AssertionError("the handler saw an undecodable request")

    context = Context()
    asyncio.run(_call(_wrap_unary(never), Undecodable(ValueError("bad bytes")), context))
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT and "bad bytes" in context.details

    async def peer_failed(request, context):
        raise PeerFault("the decode worker went away", "decode")
        yield

    context = Context()
    asyncio.run(_call(_wrap_stream(peer_failed), Request(), context))
    assert context.code == grpc.StatusCode.UNAVAILABLE and context.trailing == (("pdserve-fault", "decode"),)


def test_cancellation_and_aborts_pass_through():
    async def cancelled(request, context):
        raise asyncio.CancelledError

    async def aborted(request, context):
        raise grpc.aio.AbortError()

    for fn, kind in ((cancelled, asyncio.CancelledError), (aborted, grpc.aio.AbortError)):
        context = Context()
        with pytest.raises(kind):
            asyncio.run(_call(_wrap_unary(fn), Request(), context))
        assert context.code is None


def test_a_refusal_with_a_retry_hint_sends_it_on_both_doors():
    from router.doors.http.errors import retry_headers
    from pdserve.errors import OverloadedError
    from pdserve.rpc.errors import Unavailable

    for exc, code in ((Unavailable("no decode worker is ready", 1.0), grpc.StatusCode.UNAVAILABLE),
                      (OverloadedError("queues are full", 2.5), grpc.StatusCode.RESOURCE_EXHAUSTED)):
        async def refusing(request, context):
            raise exc

        context = Context()
        asyncio.run(_call(_wrap_unary(refusing), Request(), context))
        pushback_ms = round(exc.retry_after_s * 1000)
        assert context.code == code and context.trailing == (("grpc-retry-pushback-ms", str(pushback_ms)),)
        assert retry_headers(exc) == {"Retry-After": str(-(-pushback_ms // 1000))}
    assert retry_headers(Unavailable("draining")) == {}
