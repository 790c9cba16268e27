"""How the client reaches the routers: addresses, TLS, the tenant's token, deadlines, keepalive."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

CHANNEL_OPTIONS = (("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20))
# A router that stops answering (SIGSTOPped, cut off) fails the stream within keepalive time + timeout,
# so a client with several targets goes on at the next one (the router permits these pings).
KEEPALIVE_OPTIONS = (("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0))


@dataclass(frozen=True)
class ClientOptions:
    token: str | None = None  # a tenant's API token, sent as `authorization: Bearer ...`
    tls_ca: str | None = None  # PEM file of the CA that signed the router's certificate: TLS
    tls_cert: str | None = None  # with tls_key: a client certificate (mutual TLS)
    tls_key: str | None = None
    server_name: str | None = None  # the name to check in the router's certificate
    timeout_s: float | None = None  # each call's deadline (None: none)
    keepalive_s: float | None = 2.0  # ping a silent router this often, and give it as long to answer (None: never)
    failovers: int = 3  # times a stream goes on at the next target after its router went away (several targets)

    def credentials(self) -> grpc.ChannelCredentials | None:
        if self.tls_ca is None and self.tls_cert is None:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls_ca), private_key=_read(self.tls_key), certificate_chain=_read(self.tls_cert))

    def channel_options(self) -> tuple[tuple[str, object], ...]:
        named = (("grpc.ssl_target_name_override", self.server_name),) if self.server_name else ()
        alive = () if self.keepalive_s is None else (
            *KEEPALIVE_OPTIONS, *((k, round(self.keepalive_s * 1000)) for k in (
                "grpc.keepalive_time_ms", "grpc.keepalive_timeout_ms", "grpc.http2.ping_timeout_ms")))
        return (*CHANNEL_OPTIONS, *named, *alive)

    def deadline(self, timeout_s: float | None) -> float | None:
        """One call's deadline: its own, else these options' one."""
        return self.timeout_s if timeout_s is None else timeout_s

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The token, and the caller's current trace context (W3C traceparent), if any."""
        carrier: dict[str, str] = {}
        try:
            from opentelemetry import propagate

            propagate.inject(carrier)
        except ImportError:
            pass
        token = (("authorization", f"Bearer {self.token}"),) if self.token else ()
        return (*token, *carrier.items())


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def targets_of(target: str | Sequence[str]) -> tuple[str, ...]:
    """One router's host:port, several comma-separated, or a sequence of them."""
    found = tuple(t.strip() for t in (target.split(",") if isinstance(target, str) else target) if t.strip())
    if not found:
        raise ValueError("no target: give a router's host:port (or several)")
    return found
