"""Tracer providers for the router and the workers, and W3C context propagation helpers.

    tracing = setup_tracing("pdserve-router", args.otlp_endpoint)
    tracer = tracing.tracer()
    with tracer.start_as_current_span("generate", context=extract_context(metadata)) as span:
        call_worker(..., metadata=inject_metadata())
    tracing.shutdown()  # flushes pending spans

With nothing configured (no flag, no OTEL_EXPORTER_OTLP_*ENDPOINT) `setup_tracing` returns a
`NoopTracing`: the API's no-op tracer, no SDK provider, no span processor, no thread. A
no-op span still carries an extracted parent, so trace context passes through a process that
does not record. The global tracer provider is never touched: callers use `tracing.tracer()`.

Resource: service.name (see tracing_config), service.namespace "pdserve", a fresh
service.instance.id per SdkTracing, plus OTEL_RESOURCE_ATTRIBUTES from the process
environment (k8s.pod.name, ...), which cannot override those three.
"""

from __future__ import annotations

import abc
import uuid
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

from pdserve.telemetry.propagation import extract_context, inject_metadata
from pdserve.telemetry.tracing_config import (
    OtlpProtocol,
    SamplerConfig,
    ServiceName,
    TracingConfig,
    resolve_tracing_config,
)

__all__ = [
    "NoopTracing",
    "SdkTracing",
    "Tracing",
    "extract_context",
    "inject_metadata",
    "setup_tracing",
]

TRACER_NAME = "pdserve"


class Tracing(abc.ABC):
    """One process's tracing: a tracer provider plus its flush/shutdown."""

    config: TracingConfig
    provider: trace.TracerProvider

    @property
    @abc.abstractmethod
    def enabled(self) -> bool:
        """True when spans are recorded and exported."""

    def tracer(self, name: str = TRACER_NAME) -> trace.Tracer:
        return self.provider.get_tracer(name)

    @abc.abstractmethod
    def force_flush(self, timeout_s: float = 30.0) -> bool:
        """Export every ended span now; False if the timeout ran out first."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Flush, then stop exporting. Spans started afterwards are dropped."""


class NoopTracing(Tracing):
    """Tracing switched off: the OpenTelemetry API's no-op provider, nothing else."""

    def __init__(self, config: TracingConfig) -> None:
        self.config = config
        self.provider = trace.NoOpTracerProvider()

    @property
    def enabled(self) -> bool:
        return False

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        return True

    def shutdown(self) -> None:
        return None


class SdkTracing(Tracing):
    """An SDK tracer provider feeding one span processor (batching OTLP export in services)."""

    def __init__(self, config: TracingConfig, processor: SpanProcessor) -> None:
        self.config = config
        self.instance_id = str(uuid.uuid4())
        self.provider = TracerProvider(
            resource=_resource(config.service_name, self.instance_id),
            sampler=build_sampler(config.sampler),
        )
        self.provider.add_span_processor(processor)

    @property
    def enabled(self) -> bool:
        return True

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.provider.shutdown()


def setup_tracing(
    service_name: ServiceName | str,
    otlp_endpoint: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    exporter: SpanExporter | None = None,
) -> Tracing:
    """Build this process's tracing from the flag and the OTEL_* variables (see tracing_config).

    `env` defaults to os.environ. `exporter`, for tests, replaces the OTLP exporter and exports
    each span synchronously as it ends. Raises ValueError on a malformed OTEL_* setting.
    """
    config = resolve_tracing_config(service_name, otlp_endpoint, env)
    if exporter is not None:
        return SdkTracing(config, SimpleSpanProcessor(exporter))
    if not config.enabled:
        return NoopTracing(config)
    return SdkTracing(config, BatchSpanProcessor(otlp_exporter(config)))


def otlp_exporter(config: TracingConfig) -> SpanExporter:
    """The OTLP span exporter for `config.protocol`, imported only when tracing is on."""
    if config.protocol is OtlpProtocol.GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter(endpoint=config.endpoint)


def build_sampler(config: SamplerConfig) -> sampling.Sampler:
    root_name = config.name.removeprefix("parentbased_")
    root = {
        "always_on": sampling.ALWAYS_ON,
        "always_off": sampling.ALWAYS_OFF,
        "traceidratio": sampling.TraceIdRatioBased(config.ratio),
    }[root_name]
    return sampling.ParentBased(root) if config.name.startswith("parentbased_") else root


def _resource(service_name: str, instance_id: str) -> Resource:
    return Resource.create({
        "service.name": service_name,
        "service.namespace": "pdserve",
        "service.instance.id": instance_id,
    })
