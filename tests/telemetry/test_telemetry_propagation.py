from concurrent import futures

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pdserve.telemetry import extract_context, inject_metadata, setup_tracing

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{SPAN_ID}-01"


def _span_context(context):
    return trace.get_current_span(context).get_span_context()


@pytest.fixture
def tracing():
    tracing = setup_tracing("pdserve-router", env={}, exporter=InMemorySpanExporter())
    yield tracing
    tracing.shutdown()


def test_inject_then_extract_round_trip(tracing):
    with tracing.tracer().start_as_current_span("generate") as span:
        metadata = inject_metadata()
    sent = span.get_span_context()
    flags = int(sent.trace_flags)
    assert metadata == [("traceparent", f"00-{sent.trace_id:032x}-{sent.span_id:016x}-{flags:02x}")]
    received = _span_context(extract_context(metadata))
    assert (received.trace_id, received.span_id) == (sent.trace_id, sent.span_id)
    assert received.is_remote and received.trace_flags.sampled


def test_explicit_context_and_tracestate_survive(tracing):
    context = extract_context([("traceparent", TRACEPARENT), ("tracestate", "vendor=abc,x=1")])
    assert inject_metadata(context) == [("traceparent", TRACEPARENT), ("tracestate", "vendor=abc,x=1")]


def test_extract_matches_keys_case_insensitively_and_skips_binary_values():
    metadata = [("user-agent", "grpc"), ("TraceParent", TRACEPARENT), ("trace-bin", b"\x00\x01")]
    assert format(_span_context(extract_context(metadata)).trace_id, "032x") == TRACE_ID


@pytest.mark.parametrize(
    "metadata",
    [None, [], [("traceparent", "00-zz-yy-01")], [("traceparent", f"00-{'0' * 32}-{SPAN_ID}-01")]],
)
def test_missing_or_malformed_context_starts_a_new_trace(metadata):
    context = extract_context(metadata)
    assert not _span_context(context).is_valid
    assert inject_metadata(context) == []


def test_child_span_continues_the_remote_trace(tracing):
    exporter = InMemorySpanExporter()
    worker = setup_tracing("pdserve-prefill", env={}, exporter=exporter)
    parent = extract_context([("traceparent", TRACEPARENT)])
    with worker.tracer().start_as_current_span("prefill", context=parent):
        pass
    [span] = exporter.get_finished_spans()
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == SPAN_ID
    worker.shutdown()


def test_noop_tracing_passes_the_context_through():
    tracing = setup_tracing("pdserve-router", env={})
    parent = extract_context([("traceparent", TRACEPARENT)])
    with tracing.tracer().start_as_current_span("generate", context=parent):
        assert inject_metadata() == [("traceparent", TRACEPARENT)]


def _echo_metadata_server():
    def handler(request, context):
        span_context = _span_context(extract_context(context.invocation_metadata()))
        return f"{span_context.trace_id:032x}/{span_context.span_id:016x}".encode()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    method = grpc.unary_unary_rpc_method_handler(handler)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", {"M": method})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@pytest.mark.timeout(30)
def test_context_crosses_a_real_grpc_call(tracing):
    server, port = _echo_metadata_server()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/t.T/M")
            with tracing.tracer().start_as_current_span("generate") as span:
                reply = call(b"", metadata=inject_metadata(), timeout=10)
    finally:
        server.stop(grace=None)
    sent = span.get_span_context()
    assert reply.decode() == f"{sent.trace_id:032x}/{sent.span_id:016x}"
