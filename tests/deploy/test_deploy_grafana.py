"""deploy/grafana/pdserve.json: a dashboard Grafana can import, whose every PromQL expression reads
only series that pdserve's processes export (their Metrics built in-process, one per role, from
the role's command line), each filtered by the `model_name` template variable."""

from __future__ import annotations

import json
import re

import pytest
from deploy_paths import DEPLOY

from pdserve.cli.main import build_parser
from pdserve.telemetry import Metrics
from pdserve.worker.observability import metrics_from_args

DASHBOARD = DEPLOY / "grafana" / "pdserve.json"
ROLES = ("router", "prefill", "decode")
SERIES = re.compile(r"\b(?:pdserve_|vllm:)[A-Za-z0-9_:]*")
SELECTOR = re.compile(r"\b((?:pdserve_|vllm:)[A-Za-z0-9_:]*)(\{[^}]*\})?")
MODEL_FILTER = '{model_name=~"$model_name"}'
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
PANEL_FIELDS = {"id", "type", "title", "gridPos", "datasource", "targets"}


def series_of(metrics) -> set[str]:
    """The sample names the families of `metrics` (metric objects or a registry) are scraped as."""
    families = metrics.collect() if hasattr(metrics, "collect") else (f for m in metrics for f in m.describe())
    return {family.name + suffix for family in families for suffix in SUFFIXES.get(family.type, ())}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Every role's series, with its flags as the manifests start it (no vLLM names)."""
    return {role: series_of(metrics_from_args(build_parser().parse_args([role])).registry) for role in ROLES}


def expressions(dashboard: dict) -> list[str]:
    targets = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    variables = [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return targets + variables


def test_it_is_a_dashboard_grafana_imports(dashboard):
    assert {"title", "uid", "schemaVersion", "panels", "templating", "time"} <= set(dashboard)
    assert isinstance(dashboard["schemaVersion"], int) and re.fullmatch(r"[a-z0-9-]{1,40}", dashboard["uid"])
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in dashboard["panels"]:
        assert PANEL_FIELDS <= set(panel), panel.get("title")
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["targets"] and all({"refId", "expr"} <= set(t) for t in panel["targets"]), panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"]), panel["title"]


def test_it_has_a_model_name_variable_over_the_data_source_variable(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    model = variables["model_name"]
    assert model["type"] == "query" and model["datasource"]["uid"] == "${datasource}"
    assert model["definition"] == model["query"]["query"]
    assert re.fullmatch(r"label_values\(\w+, model_name\)", model["definition"])


def test_every_expression_reads_only_what_pdserve_exports(dashboard, exported):
    every_role = set().union(*exported.values())
    named = {name for expr in expressions(dashboard) for name in SERIES.findall(expr)}
    missing = named - every_role
    assert named and not missing, missing
    assert not any(name.startswith("vllm:") for name in named)  # the dashboard works without --vllm-metric-names


def test_every_selector_is_filtered_by_the_model_and_carries_that_label(dashboard):
    labelled = series_of(Metrics().model_families())
    for expr in [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]:
        for name, matchers in SELECTOR.findall(expr):
            assert matchers == MODEL_FILTER, expr
            assert name in labelled, name


def test_the_panels_cover_what_an_operator_charts(dashboard):
    text = json.dumps(dashboard["panels"])
    for family in ("time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket",
                   "e2e_request_latency_seconds_bucket", "request_queue_time_seconds_bucket", "requests_running",
                   "requests_waiting", "kv_cache_usage_ratio", "prefix_cache_hit_tokens_total",
                   "prefix_cache_query_tokens_total", "preemptions_total", "prompt_tokens_total",
                   "generation_tokens_total"):
        assert f"pdserve_{family}" in text, family
    assert "histogram_quantile(0.99" in text and "histogram_quantile(0.5" in text
