"""TLS, mutual TLS and bearer tokens for every gRPC server and client of the service.

    server: --tls-cert/--tls-key -> TLS; + --tls-ca -> clients must present a certificate it signed
    client: --tls-ca verifies peers (and with --tls-cert/--tls-key presents ours: mutual TLS)
    tokens: --cluster-token-file guards PrefillWorker/DecodeWorker and the router's Registry (and
            is sent on every internal call); the tenants' tokens (router/doors/tenants.py, --api-token-file)
            guard Generation and reflection. Health and the workers' Stats (load counters, as on
            /metrics) never need a token.

Plaintext only when no certificate is given. The internal plane is closed by default: a service
with neither a cluster token nor mutual TLS refuses to start unless given --insecure
(development only).
"""

from __future__ import annotations

import argparse
import hmac
import os
import secrets
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

INTERNAL_SERVICES = ("/pdserve.v1.PrefillWorker/", "/pdserve.v1.DecodeWorker/", "/pdserve.v1.Registry/",
                     "/pdserve.v1.WorkerControl/")
PUBLIC_SERVICES = ("/pdserve.v1.Generation/", "/grpc.reflection.")
OPEN_METHODS = ("/pdserve.v1.PrefillWorker/Stats", "/pdserve.v1.DecodeWorker/Stats")
MIN_TOKEN_CHARS = 16


@dataclass(frozen=True)
class Security:
    cert: bytes | None = None
    key: bytes | None = None
    ca: bytes | None = None
    server_name: str | None = None
    cluster_token: str | None = None
    api_tokens: tuple[str, ...] = ()  # any of them opens the public API; none: it is open

    @property
    def tls(self) -> bool:
        return self.cert is not None

    @property
    def closed(self) -> bool:
        """Whether internal calls need a credential: the cluster token, or a client certificate
        the CA signed (mutual TLS)."""
        return self.cluster_token is not None or (self.tls and self.ca is not None)

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls:
            return None
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=self.ca is not None)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The same server TLS for a non-gRPC listener (the HTTP API); None for plaintext."""
        if not self.tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.NamedTemporaryFile() as cert, tempfile.NamedTemporaryFile() as key:
            cert.write(self.cert), key.write(self.key)
            cert.flush(), key.flush()
            context.load_cert_chain(cert.name, key.name)
        if self.ca is not None:
            context.load_verify_locations(cadata=self.ca.decode())
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        if self.ca is None and not self.tls:
            return None
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    def channel_options(self) -> tuple[tuple[str, str], ...]:
        return (("grpc.ssl_target_name_override", self.server_name),) if self.server_name else ()

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        guards = [(INTERNAL_SERVICES, (self.cluster_token,) if self.cluster_token else ()),
                  (PUBLIC_SERVICES, self.api_tokens)]
        return [TokenGuard(prefixes, tokens, OPEN_METHODS) for prefixes, tokens in guards if tokens]

    def client_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.cluster_token}"),) if self.cluster_token else ()


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def _cluster_token(path: str | None) -> str | None:
    if not path:
        return None
    token = Path(path).read_text().strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise SystemExit(f"--cluster-token-file {path}: the token has fewer than {MIN_TOKEN_CHARS} characters")
    return token


def security_from_args(args: argparse.Namespace, api_tokens: tuple[str, ...] = ()) -> Security:
    """`api_tokens`: the tenants' tokens (the router reads its tenants file itself). SystemExit
    with the reason when the flags do not go together, or leave the internal plane open without
    --insecure."""
    cert, key = _read(getattr(args, "tls_cert", None)), _read(getattr(args, "tls_key", None))
    if (cert is None) != (key is None):
        raise SystemExit("--tls-cert and --tls-key go together")
    security = Security(cert, key, _read(getattr(args, "tls_ca", None)), getattr(args, "tls_server_name", None),
                        _cluster_token(getattr(args, "cluster_token_file", None)), api_tokens)
    if not security.closed and not getattr(args, "insecure", False):
        raise SystemExit(f"pdserve {getattr(args, 'role', 'service')}: refusing to start with the internal plane "
                         "open: give --cluster-token-file (or mutual TLS: --tls-cert, --tls-key and --tls-ca); "
                         "--insecure runs without either, for development only")
    return security


def write_cluster_token(path: Path) -> Path:
    """A fresh random cluster token in `path`, readable by its owner only (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    os.chmod(path, 0o600)
    return path


def add_security_flags(p: argparse.ArgumentParser, api_token: bool) -> None:
    g = p.add_argument_group("security")
    g.add_argument("--tls-cert", default=None, help="PEM certificate chain (with --tls-key: serve TLS)")
    g.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    g.add_argument("--tls-ca", default=None, help="PEM CA bundle: mutual TLS, and verifies peers")
    g.add_argument("--tls-server-name", default=None, help="name expected in peers' certificates")
    g.add_argument("--cluster-token-file", default=None,
                   help=f"shared token (at least {MIN_TOKEN_CHARS} characters) of internal RPCs: required on "
                        "them, sent on every internal call")
    g.add_argument("--insecure", action="store_true",
                   help="development only: start without a cluster token or mutual TLS, the internal plane "
                        "open to anyone who can reach its ports")
    if api_token:
        g.add_argument("--api-token-file", default=None,
                       help="tenants file: one '<token> [tenant=NAME] [max_priority=vip|normal|batch] "
                            "[over_priority=refuse|lower] [max_concurrent=N]' per line (a bare token: tenant "
                            "'default', every class); clients send 'authorization: Bearer <token>'")
        g.add_argument("--anonymous-max-priority", default="normal", choices=["vip", "normal", "batch"],
                       help="without --api-token-file: the highest class anyone may ask for")


class TokenGuard(grpc.aio.ServerInterceptor):
    """Refuses calls to the guarded services without `authorization: Bearer <token>` of one of
    `tokens`; the methods named in `exempt` stay open."""

    def __init__(self, prefixes: Sequence[str], tokens: Sequence[str], exempt: Sequence[str] = ()):
        self.prefixes = tuple(prefixes)
        self.exempt = frozenset(exempt)
        self.expected = tuple(f"Bearer {token}".encode() for token in tokens)

    async def intercept_service(self, continuation, details):
        guarded = details.method.startswith(self.prefixes) and details.method not in self.exempt
        if not guarded or self._allowed(details.invocation_metadata):
            return await continuation(details)
        return _refuse(await continuation(details))

    def _allowed(self, metadata) -> bool:
        given = dict(metadata or ()).get("authorization", "")
        given = given.encode() if isinstance(given, str) else given
        return any([hmac.compare_digest(given, expected) for expected in self.expected])


def _refuse(handler):
    async def deny(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    async def deny_stream(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        yield  # pragma: no cover - makes this an async generator

    if handler is None:
        return None
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny, handler.request_deserializer, handler.response_serializer)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny_stream, handler.request_deserializer,
                                                    handler.response_serializer)
    if handler.stream_stream:
        async def deny_bidi(requests, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
            yield  # pragma: no cover
        return grpc.stream_stream_rpc_method_handler(deny_bidi, handler.request_deserializer,
                                                     handler.response_serializer)
    return handler


def metadata_injectors(metadata: tuple[tuple[str, str], ...]) -> tuple[grpc.aio.ClientInterceptor, ...]:
    """Client interceptors adding fixed metadata (the cluster token) to every call of a channel.
    NOTE: a channel files each interceptor under one call type only, hence one object per type."""
    return (_UnaryInjector(metadata), _StreamInjector(metadata))


def _with(details, metadata: tuple[tuple[str, str], ...]):
    return details._replace(metadata=grpc.aio.Metadata(*(details.metadata or ()), *metadata))


class _UnaryInjector(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, metadata: tuple[tuple[str, str], ...]):
        self.metadata = metadata

    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(_with(details, self.metadata), request)


class _StreamInjector(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, metadata: tuple[tuple[str, str], ...]):
        self.metadata = metadata

    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(_with(details, self.metadata), request)
