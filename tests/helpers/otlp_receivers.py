"""In-process OTLP trace receivers (gRPC and HTTP/protobuf) for tests."""

from __future__ import annotations

import gzip
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as trace_grpc


class ReceivedSpan(NamedTuple):
    name: str
    resource: dict
    attributes: dict
    trace_id: str
    span_id: str
    parent_span_id: str
    events: tuple[tuple[str, dict], ...] = ()
    status_code: int = 0
    status_message: str = ""


def _value(any_value):
    """An attribute's value as Python has it (an array as a tuple)."""
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in any_value.array_value.values)
    return getattr(any_value, kind) if kind else None


def _attributes(key_values) -> dict:
    return {kv.key: _value(kv.value) for kv in key_values}


class SpanSink:
    """Collects every span of every ExportTraceServiceRequest it is given."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._cond = threading.Condition()

    def add(self, request: trace_pb.ExportTraceServiceRequest) -> None:
        spans = [
            ReceivedSpan(
                name=span.name,
                resource=_attributes(rs.resource.attributes),
                attributes=_attributes(span.attributes),
                trace_id=span.trace_id.hex(),
                span_id=span.span_id.hex(),
                parent_span_id=span.parent_span_id.hex(),
                events=tuple((e.name, _attributes(e.attributes)) for e in span.events),
                status_code=span.status.code,
                status_message=span.status.message,
            )
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]
        with self._cond:
            self._spans.extend(spans)
            self._cond.notify_all()

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._cond:
            return list(self._spans)

    def clear(self) -> None:
        with self._cond:
            self._spans.clear()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._spans) < count and time.monotonic() < deadline:
                self._cond.wait(timeout=deadline - time.monotonic())
            return list(self._spans)


class _TraceService(trace_grpc.TraceServiceServicer):
    def __init__(self, sink: SpanSink) -> None:
        self.sink = sink

    def Export(self, request, context):
        self.sink.add(request)
        return trace_pb.ExportTraceServiceResponse()


class GrpcReceiver:
    """OTLP/gRPC TraceService on 127.0.0.1:<free port>."""

    def __init__(self) -> None:
        self.sink = SpanSink()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_grpc.add_TraceServiceServicer_to_server(_TraceService(self.sink), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._server.stop(grace=None).wait(5)


class HttpReceiver:
    """OTLP/HTTP protobuf receiver accepting POST <path> on 127.0.0.1:<free port>."""

    def __init__(self, path: str = "/v1/traces") -> None:
        self.sink = SpanSink()
        self.paths: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(path))
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _handler(self, path: str):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                receiver.paths.append(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != path:
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver.sink.add(trace_pb.ExportTraceServiceRequest.FromString(body))
                reply = trace_pb.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        return Handler

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
