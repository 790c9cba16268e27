"""Tracing settings resolved once from a command-line flag and the standard OTEL_* variables.

Precedence, highest first:

- endpoint: the `--otlp-endpoint` flag, then `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as
  is), then `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL: `/v1/traces` is appended for
  http/protobuf). The flag is a base URL too, unless it already ends in `/v1/traces`.
  No endpoint anywhere means tracing is off.
- protocol: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, then `OTEL_EXPORTER_OTLP_PROTOCOL`;
  `grpc` (default) or `http/protobuf`.
- service name: `OTEL_SERVICE_NAME`, then the role's name (pdserve-router, ...).
- sampler: `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`; default parentbased_always_on.
- kill switches: `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn tracing off even
  when an endpoint is set.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

ServiceName = Literal["pdserve-router", "pdserve-prefill", "pdserve-decode"]
TRACES_PATH = "/v1/traces"
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)


class OtlpProtocol(enum.Enum):
    GRPC = "grpc"
    HTTP_PROTOBUF = "http/protobuf"


@dataclass(frozen=True)
class SamplerConfig:
    """A sampler named as in OTEL_TRACES_SAMPLER; `ratio` is used by the *traceidratio ones."""

    name: str = "parentbased_always_on"
    ratio: float = 1.0


@dataclass(frozen=True)
class TracingConfig:
    """Everything needed to build a tracer provider. `endpoint` None means tracing is off."""

    service_name: str
    endpoint: str | None = None
    protocol: OtlpProtocol = OtlpProtocol.GRPC
    sampler: SamplerConfig = SamplerConfig()

    @property
    def enabled(self) -> bool:
        return self.endpoint is not None


def resolve_tracing_config(
    service_name: ServiceName | str, otlp_endpoint: str | None = None, env: Mapping[str, str] | None = None
) -> TracingConfig:
    """Build the config for one process; `env` defaults to os.environ. Raises ValueError."""
    env = os.environ if env is None else env
    protocol = _protocol(env)
    return TracingConfig(
        service_name=_get(env, "OTEL_SERVICE_NAME") or service_name,
        endpoint=None if _disabled(env) else _endpoint(otlp_endpoint, protocol, env),
        protocol=protocol,
        sampler=_sampler(env),
    )


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


def _disabled(env: Mapping[str, str]) -> bool:
    sdk_disabled = (_get(env, "OTEL_SDK_DISABLED") or "").lower() == "true"
    return sdk_disabled or (_get(env, "OTEL_TRACES_EXPORTER") or "").lower() == "none"


def _protocol(env: Mapping[str, str]) -> OtlpProtocol:
    name = _get(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or _get(env, "OTEL_EXPORTER_OTLP_PROTOCOL")
    try:
        return OtlpProtocol(name or OtlpProtocol.GRPC.value)
    except ValueError:
        raise ValueError(f"unsupported OTLP protocol {name!r}: use grpc or http/protobuf") from None


def _endpoint(flag: str | None, protocol: OtlpProtocol, env: Mapping[str, str]) -> str | None:
    if flag and flag.strip():
        return _with_scheme(_traces_url(flag.strip(), protocol))
    signal = _get(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if signal:
        return _with_scheme(signal)
    base = _get(env, "OTEL_EXPORTER_OTLP_ENDPOINT")
    return _with_scheme(_traces_url(base, protocol)) if base else None


def _traces_url(base: str, protocol: OtlpProtocol) -> str:
    if protocol is OtlpProtocol.GRPC or base.rstrip("/").endswith(TRACES_PATH):
        return base
    return base.rstrip("/") + TRACES_PATH


def _with_scheme(url: str) -> str:
    return url if "://" in url else f"http://{url}"


def _sampler(env: Mapping[str, str]) -> SamplerConfig:
    name = (_get(env, "OTEL_TRACES_SAMPLER") or SamplerConfig.name).lower()
    if name not in SAMPLERS:
        raise ValueError(f"unsupported OTEL_TRACES_SAMPLER {name!r}: use one of {SAMPLERS}")
    arg = _get(env, "OTEL_TRACES_SAMPLER_ARG")
    ratio = float(arg) if arg and name.endswith("traceidratio") else 1.0
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG must be in [0, 1], got {ratio}")
    return SamplerConfig(name=name, ratio=ratio)
