import threading
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pdserve.telemetry import NoopTracing, SdkTracing, setup_tracing

ATTRIBUTES = {"pdserve.request_id": "r-1", "pdserve.tokens": 7, "pdserve.tbt.p50": 0.012}


def _emit(tracing, name="generate"):
    with tracing.tracer().start_as_current_span(name, attributes=ATTRIBUTES) as span:
        return span.get_span_context()


@pytest.mark.timeout(60)
def test_grpc_export_carries_resource_and_attributes(grpc_receiver):
    tracing = setup_tracing("pdserve-router", grpc_receiver.endpoint, env={})
    assert isinstance(tracing, SdkTracing)
    _emit(tracing)
    tracing.shutdown()
    [span] = grpc_receiver.sink.spans
    assert span.name == "generate"
    assert span.attributes == ATTRIBUTES
    assert span.resource["service.name"] == "pdserve-router"
    assert span.resource["service.instance.id"] == tracing.instance_id


@pytest.mark.timeout(60)
def test_http_protobuf_export_from_env(http_receiver):
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": http_receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "prefill-a",
    }
    tracing = setup_tracing("pdserve-prefill", env=env)
    context = _emit(tracing, "prefill")
    assert tracing.force_flush(timeout_s=10)
    [span] = http_receiver.sink.wait_for(1)
    assert http_receiver.paths == ["/v1/traces"]
    assert (span.name, span.resource["service.name"]) == ("prefill", "prefill-a")
    assert span.attributes == ATTRIBUTES
    assert span.trace_id == format(context.trace_id, "032x")
    tracing.shutdown()


@pytest.mark.timeout(60)
def test_process_environment_is_honoured(grpc_receiver, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", grpc_receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    tracing = setup_tracing("pdserve-decode")
    _emit(tracing, "decode")
    tracing.shutdown()
    assert [s.resource["service.name"] for s in grpc_receiver.sink.spans] == ["pdserve-decode"]


@pytest.mark.timeout(60)
def test_flag_wins_over_env_endpoint(grpc_receiver):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    tracing = setup_tracing("pdserve-router", grpc_receiver.endpoint, env=env)
    _emit(tracing)
    tracing.shutdown()
    assert len(grpc_receiver.sink.spans) == 1


def test_nothing_configured_builds_no_sdk():
    threads_before = set(threading.enumerate())
    global_provider = trace.get_tracer_provider()
    tracing = setup_tracing("pdserve-router", None, env={})
    assert isinstance(tracing, NoopTracing) and not tracing.enabled
    assert isinstance(tracing.provider, trace.NoOpTracerProvider)
    assert not isinstance(tracing.provider, SdkTracerProvider)
    with tracing.tracer().start_as_current_span("x") as span:
        assert not span.is_recording()
        assert not span.get_span_context().is_valid
    assert tracing.force_flush() and tracing.shutdown() is None
    assert set(threading.enumerate()) == threads_before
    assert trace.get_tracer_provider() is global_provider


def test_sdk_tracing_leaves_the_global_provider_alone():
    global_provider = trace.get_tracer_provider()
    tracing = setup_tracing("pdserve-router", env={}, exporter=InMemorySpanExporter())
    _emit(tracing)
    assert trace.get_tracer_provider() is global_provider
    tracing.shutdown()


def test_injected_exporter_receives_spans_synchronously():
    exporter = InMemorySpanExporter()
    tracing = setup_tracing("pdserve-prefill", env={}, exporter=exporter)
    _emit(tracing, "prefill")
    [span] = exporter.get_finished_spans()
    assert span.name == "prefill" and dict(span.attributes) == ATTRIBUTES
    assert span.resource.attributes["service.name"] == "pdserve-prefill"
    tracing.shutdown()


def test_instance_ids_are_unique():
    a = setup_tracing("pdserve-decode", env={}, exporter=InMemorySpanExporter())
    b = setup_tracing("pdserve-decode", env={}, exporter=InMemorySpanExporter())
    assert a.instance_id != b.instance_id
    a.shutdown()
    b.shutdown()


@pytest.mark.parametrize(
    "env, recorded",
    [
        ({"OTEL_TRACES_SAMPLER": "always_off"}, 0),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}, 0),
        ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1"}, 1),
    ],
)
def test_sampler_env_is_applied(env, recorded):
    exporter = InMemorySpanExporter()
    tracing = setup_tracing("pdserve-router", env=env, exporter=exporter)
    _emit(tracing)
    assert len(exporter.get_finished_spans()) == recorded
    tracing.shutdown()


@pytest.mark.timeout(60)
def test_unreachable_collector_delays_shutdown_by_the_exporter_timeout_only(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    tracing = setup_tracing("pdserve-router", "http://127.0.0.1:9", env={})
    _emit(tracing)
    started = time.monotonic()
    tracing.shutdown()
    assert time.monotonic() - started < 5.0


def test_resource_attributes_env_is_merged(monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=router-0,service.name=ignored")
    exporter = InMemorySpanExporter()
    tracing = setup_tracing("pdserve-router", env={}, exporter=exporter)
    _emit(tracing)
    resource = exporter.get_finished_spans()[0].resource.attributes
    assert resource["k8s.pod.name"] == "router-0"
    assert resource["service.name"] == "pdserve-router"
    tracing.shutdown()
