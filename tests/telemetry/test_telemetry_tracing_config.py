import pytest

from pdserve.telemetry.tracing_config import (
    OtlpProtocol,
    SamplerConfig,
    TracingConfig,
    resolve_tracing_config,
)


def resolve(flag=None, **env):
    return resolve_tracing_config("pdserve-router", flag, env=env)


def test_nothing_configured_is_off():
    config = resolve()
    assert config == TracingConfig(service_name="pdserve-router")
    assert not config.enabled


def test_generic_endpoint_grpc_is_used_as_is():
    config = resolve(OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4317")
    assert config.endpoint == "http://collector:4317"
    assert config.protocol is OtlpProtocol.GRPC and config.enabled


def test_generic_endpoint_http_gets_the_traces_path():
    config = resolve(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318/",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
    )
    assert config.endpoint == "http://collector:4318/v1/traces"
    assert config.protocol is OtlpProtocol.HTTP_PROTOBUF


def test_signal_endpoint_beats_generic_and_is_kept_verbatim():
    config = resolve(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://generic:4318",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://traces:4318/custom",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
    )
    assert config.endpoint == "http://traces:4318/custom"


def test_flag_beats_every_env_endpoint():
    config = resolve(
        "http://flag:4317",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://generic:4317",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://traces:4317",
    )
    assert config.endpoint == "http://flag:4317"


@pytest.mark.parametrize(
    "flag, expected",
    [
        ("http://flag:4318", "http://flag:4318/v1/traces"),
        ("http://flag:4318/v1/traces", "http://flag:4318/v1/traces"),
        ("flag:4318", "http://flag:4318/v1/traces"),
    ],
)
def test_http_flag_is_a_base_url(flag, expected):
    assert resolve(flag, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf").endpoint == expected


def test_endpoint_without_scheme_gets_http():
    assert resolve("localhost:4317").endpoint == "http://localhost:4317"


def test_signal_protocol_beats_generic_protocol():
    config = resolve(
        "http://x:1",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
    )
    assert config.protocol is OtlpProtocol.HTTP_PROTOBUF


def test_service_name_env_overrides_role_name():
    assert resolve(OTEL_SERVICE_NAME="edge-router").service_name == "edge-router"
    assert resolve(OTEL_SERVICE_NAME="  ").service_name == "pdserve-router"


@pytest.mark.parametrize("switch", [{"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}])
def test_kill_switches_turn_tracing_off_even_with_a_flag(switch):
    assert not resolve("http://flag:4317", **switch).enabled


def test_sampler_from_env():
    assert resolve().sampler == SamplerConfig("parentbased_always_on", 1.0)
    config = resolve(OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.25")
    assert config.sampler == SamplerConfig("traceidratio", 0.25)
    assert resolve(OTEL_TRACES_SAMPLER="always_off").sampler.name == "always_off"


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
        {"OTEL_TRACES_SAMPLER": "jaeger_remote"},
        {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
    ],
)
def test_malformed_settings_raise(env):
    with pytest.raises(ValueError):
        resolve(**env)


def test_defaults_to_process_environment(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://env:4317")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    config = resolve_tracing_config("pdserve-decode")
    assert (config.endpoint, config.service_name) == ("http://env:4317", "from-env")
