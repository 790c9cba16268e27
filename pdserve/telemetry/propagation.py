"""W3C trace context (`traceparent`, `tracestate`) in gRPC metadata, as plain tuples.

Services call these from their interceptors or servicers:

    ctx = extract_context(grpc_context.invocation_metadata())  # server side
    stub.Prefill(request, metadata=inject_metadata())          # client side, current span

Only W3C trace context travels; baggage and other propagators configured globally are ignored
on purpose, so every hop speaks the same two headers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

Metadata = Iterable[tuple[str, str | bytes]]


def extract_context(metadata: Metadata | None) -> Context:
    """A fresh Context holding the remote parent span found in `metadata`, if any.

    Keys match case-insensitively; binary (bytes) values are skipped. Without a valid
    `traceparent` the result is an empty Context (new spans start a new trace).
    """
    carrier: dict[str, list[str]] = {}
    for key, value in metadata or ():
        if isinstance(value, str):
            carrier.setdefault(key.lower(), []).append(value)
    return TraceContextTextMapPropagator().extract(carrier, context=Context())


def inject_metadata(context: Context | None = None) -> list[tuple[str, str]]:
    """Metadata entries carrying the span of `context` (default: the current context).

    Empty when that context holds no valid span.
    """
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=context)
    return sorted(carrier.items())


@contextmanager
def stream_span(tracer: trace.Tracer, name: str, **kwargs) -> Iterator[trace.Span]:
    """A span around a streaming handler (an async generator), never made the current one:
    a generator may be closed from another context than the one it started in, where detaching
    an attached context fails (and logs at ERROR). Pass the span explicitly instead."""
    span = tracer.start_span(name, **kwargs)
    try:
        yield span
    except BaseException as exc:
        if not isinstance(exc, GeneratorExit | asyncio.CancelledError):
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        span.end()
