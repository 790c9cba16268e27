"""deploy/k8s/components/autoscaling: added to an overlay it renders one HorizontalPodAutoscaler more,
valid strictly, on the decode StatefulSet, driven by a gauge the decode worker exports; the
Prometheus Adapter rule its comment gives is YAML that serves that gauge per pod."""

from __future__ import annotations

import os
import re

import kubernetes_validate
import pytest
import yaml
from deploy_paths import K8S, layout_dir
from k8s_render import render

from pdserve.cli.main import build_parser
from pdserve.worker.observability import metrics_from_args

COMPONENT = K8S / "components" / "autoscaling"
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


def _with_component(layout: str, tmp_path) -> list[dict]:
    """`layout` with the component, rendered as an overlay of one's own would (kustomize wants
    relative paths)."""
    spec = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(layout_dir(layout), tmp_path)],
            "components": [os.path.relpath(COMPONENT, tmp_path)]}
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    return render(tmp_path)


def _ids(manifests: list[dict]) -> list[tuple[str, str]]:
    return sorted((m["kind"], m["metadata"]["name"]) for m in manifests)


def _adapter_rule() -> dict:
    """The rule in hpa.yaml's comment: the indented comment lines from `rules:` on."""
    lines = COMPONENT.joinpath("hpa.yaml").read_text().splitlines()
    start = lines.index("#   rules:")
    block = [line[1:] for line in lines[start:] if line.startswith("#   ")]
    [rule] = yaml.safe_load("\n".join(block))["rules"]
    return rule


@pytest.mark.parametrize("layout", ["cpu-demo", "gpu"])
def test_the_component_adds_a_valid_hpa_on_the_decode_statefulset(rendered, layout, tmp_path):
    manifests = _with_component(layout, tmp_path)
    assert _ids(manifests) == sorted(_ids(rendered[layout]) + [("HorizontalPodAutoscaler", "pdserve-decode")])
    [hpa] = [m for m in manifests if m["kind"] == "HorizontalPodAutoscaler"]
    for version in VERSIONS:
        kubernetes_validate.validate(hpa, version, strict=True)
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == ("apps/v1", "StatefulSet")
    assert target["name"] in {m["metadata"]["name"] for m in manifests if m["kind"] == "StatefulSet"}
    assert target["name"] == "pdserve-decode"
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]


def test_the_hpa_reads_the_waiting_gauge_the_decode_worker_exports():
    [hpa] = yaml.safe_load_all(COMPONENT.joinpath("hpa.yaml").read_text())
    [metric] = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    decode = metrics_from_args(build_parser().parse_args(["decode"]))
    gauges = {f.name for f in decode.registry.collect() if f.type == "gauge"}
    assert name == "pdserve_requests_waiting" and name in gauges
    assert metric["pods"]["target"]["type"] == "AverageValue"


def test_the_adapter_rule_in_the_comment_serves_that_gauge_per_pod():
    rule = _adapter_rule()
    assert re.match(r"pdserve_requests_waiting\{", rule["seriesQuery"])
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert re.fullmatch(rule["name"]["matches"], "pdserve_requests_waiting")
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]
