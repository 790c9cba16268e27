"""Traces (OpenTelemetry, OTLP export) and metrics (Prometheus) for pdserve processes.

Pure library code: no servicers, no wire types. gRPC code passes metadata as plain
`(key, value)` tuples to `extract_context` / `inject_metadata`.
"""

from pdserve.telemetry.latency import Percentiles, TimelineSummary, TokenTimeline, summarize
from pdserve.telemetry.metrics import EXPOSITION_CONTENT_TYPE, Metrics
from pdserve.telemetry.metrics_server import MetricsServer
from pdserve.telemetry.propagation import extract_context, inject_metadata, stream_span
from pdserve.telemetry.tracing import NoopTracing, SdkTracing, Tracing, setup_tracing
from pdserve.telemetry.tracing_config import OtlpProtocol, TracingConfig, resolve_tracing_config

__all__ = [
    "EXPOSITION_CONTENT_TYPE",
    "Metrics",
    "MetricsServer",
    "NoopTracing",
    "OtlpProtocol",
    "Percentiles",
    "SdkTracing",
    "TimelineSummary",
    "TokenTimeline",
    "Tracing",
    "TracingConfig",
    "extract_context",
    "inject_metadata",
    "resolve_tracing_config",
    "setup_tracing",
    "stream_span",
    "summarize",
]
