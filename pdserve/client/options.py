"""How the client reaches the router: address, TLS, the tenant's token, deadlines."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

CHANNEL_OPTIONS = (("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20))


@dataclass(frozen=True)
class ClientOptions:
    token: str | None = None  # a tenant's API token, sent as `authorization: Bearer ...`
    tls_ca: str | None = None  # PEM file of the CA that signed the router's certificate: TLS
    tls_cert: str | None = None  # with tls_key: a client certificate (mutual TLS)
    tls_key: str | None = None
    server_name: str | None = None  # the name to check in the router's certificate
    timeout_s: float | None = None  # each call's deadline (None: none)

    def credentials(self) -> grpc.ChannelCredentials | None:
        if self.tls_ca is None and self.tls_cert is None:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls_ca), private_key=_read(self.tls_key), certificate_chain=_read(self.tls_cert))

    def channel_options(self) -> tuple[tuple[str, object], ...]:
        named = (("grpc.ssl_target_name_override", self.server_name),) if self.server_name else ()
        return (*CHANNEL_OPTIONS, *named)

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
