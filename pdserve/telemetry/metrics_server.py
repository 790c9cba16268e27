"""The `--metrics-port` endpoint: a registry served in Prometheus text format from a daemon thread."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import start_http_server


@dataclass(frozen=True)
class MetricsServer:
    """A running `/metrics` HTTP endpoint; `port` is the bound one (useful with port 0)."""

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)


def serve_metrics(registry: CollectorRegistry, port: int = 0, host: str = "127.0.0.1") -> MetricsServer:
    """Serve `registry` on http://host:port/metrics; port 0 picks a free port."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(host=host, port=server.server_address[1], _server=server, _thread=thread)
