"""A service's Prometheus counters as a test reads them off its /metrics."""

from __future__ import annotations

import urllib.request


def counters(metrics_port: int, family: str, label: str | None = None,
             where: dict[str, str] | None = None) -> dict[str, float]:
    """`family`'s `_total` samples (family without `_total`) by the value of `label` ("" when
    None: their sum under one key); `where`: only the samples with these label values."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    found: dict[str, float] = {}
    for f in text_string_to_metric_families(text):
        if f.name != family:
            continue
        for s in f.samples:
            if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in (where or {}).items()):
                key = s.labels[label] if label else ""
                found[key] = found.get(key, 0.0) + s.value
    return found


def gauge(metrics_port: int, family: str, where: dict[str, str] | None = None) -> float:
    """The sum of `family`'s samples with these label values."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == family for s in f.samples
               if all(s.labels.get(k) == v for k, v in (where or {}).items()))
