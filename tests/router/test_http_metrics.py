"""GET /metrics on the HTTP door: the router's registry in Prometheus text format 0.0.4, as the
--metrics-port endpoint serves it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from pdserve.telemetry import Metrics
from router.doors.http.app import HttpApi, HttpSettings


async def _get(api: HttpApi, path: str) -> tuple[int, str, str]:
    async with TestClient(TestServer(api.application())) as client:
        response = await client.get(path)
        return response.status, response.headers["Content-Type"], await response.text()


def test_metrics_route_serves_the_registry_as_prometheus_text():
    metrics = Metrics("tiny")
    metrics.observe_ttft(0.25)
    gateway = SimpleNamespace(frontend=None)
    api = HttpApi(gateway, HttpSettings("tiny", 2048, 1 << 20), str, lambda: True, metrics.exposition)
    status, content_type, text = asyncio.run(_get(api, "/metrics"))
    assert status == 200
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("pdserve_time_to_first_token_seconds_count", (("model_name", "tiny"),))] == 1
