"""Every Kubernetes manifest validates strictly, and the pods are shaped as deploy/README.md says."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from deploy_contract import k8s_invocations
from deploy_paths import K8S, LAYOUTS
from k8s_render import pod_templates

OLDEST_VERSION = "1.27.0"  # gRPC probes are GA from 1.27
VERSIONS = (OLDEST_VERSION, kubernetes_validate.latest_version())
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")
PROBE_HANDLERS = {"grpc", "httpGet", "tcpSocket", "exec"}
READINESS_SERVICE = {"router": "pdserve.v1.Generation", "prefill": "", "decode": ""}
REPLICAS = {
    "base": {"pdserve-router": 2, "pdserve-prefill": 1, "pdserve-decode": 1},
    "cpu-demo": {"pdserve-router": 2, "pdserve-prefill": 1, "pdserve-decode": 1},
    "cpu-demo-elastic": {"pdserve-router": 2, "pdserve-prefill": 1, "pdserve-decode": 2},
    "gpu": {"pdserve-router": 2, "pdserve-prefill": 2, "pdserve-decode": 2},
}
GPU = "nvidia.com/gpu"
VALIDATE_CLI = Path(sys.executable).parent / "kubernetes-validate"


def validation_errors(manifest: dict, version: str) -> list[str]:
    try:
        kubernetes_validate.validate(manifest, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        return [f"{manifest['kind']}/{manifest['metadata']['name']} @ {version}: {err.message}"]
    return []


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rendered_layout_validates_strictly(rendered, layout):
    errors = [e for m in rendered[layout] for v in VERSIONS for e in validation_errors(m, v)]
    assert errors == []
    assert len(rendered[layout]) == 15


def test_base_files_pass_the_kubernetes_validate_cli():
    files = sorted(str(p) for p in (K8S / "base").glob("*.yaml") if p.name != "kustomization.yaml")
    command = [str(VALIDATE_CLI), "--strict", "--quiet", *files]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("version", VERSIONS)
def test_rendered_output_passes_the_kubernetes_validate_cli_strictly(rendered_yaml, layout, version, tmp_path):
    manifests = tmp_path / f"{layout}.yaml"
    manifests.write_text(rendered_yaml[layout])
    command = [str(VALIDATE_CLI), "--strict", "--quiet", "-k", version, str(manifests)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr


def test_strict_validation_rejects_an_unknown_field(rendered):
    workloads = {w["metadata"]["name"]: w for w, _ in pod_templates(rendered["base"])}
    router = copy.deepcopy(workloads["pdserve-router"])
    router["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    assert validation_errors(router, VERSIONS[-1]) != []


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pdserve_probes_are_grpc_probes_on_the_health_port(rendered, layout):
    roles = set()
    for container, call in k8s_invocations(rendered[layout]):
        roles.add(call.role)
        health_port = int(call.flags["--health-port"])
        for name in PROBES:
            probe = container[name]
            assert set(probe) & PROBE_HANDLERS == {"grpc"}, (call.where, name)
            assert probe["grpc"]["port"] == health_port, (call.where, name)
        assert container["startupProbe"]["grpc"]["service"] == "liveness"
        assert container["livenessProbe"]["grpc"]["service"] == "liveness"
        assert container["readinessProbe"]["grpc"].get("service", "") == READINESS_SERVICE[call.role]
        assert health_port in {p["containerPort"] for p in container["ports"]}
    assert roles == {"router", "prefill", "decode"}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_container_requests_cpu_and_memory_and_caps_memory(rendered, layout):
    for workload, pod in pod_templates(rendered[layout]):
        for container in pod["containers"]:
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), workload["metadata"]["name"]
            assert "memory" in resources["limits"], workload["metadata"]["name"]


def test_gpu_overlay_gives_each_worker_its_gpus_and_the_router_none(rendered):
    gpus = {"pdserve-prefill": "4", "pdserve-decode": "4"}  # one per tensor-parallel rank
    for workload, pod in pod_templates(rendered["gpu"]):
        resources = pod["containers"][0]["resources"]
        wants_gpu = workload["metadata"]["name"] in gpus
        assert (GPU in resources["requests"]) == wants_gpu, workload["metadata"]["name"]
        if wants_gpu:
            assert resources["requests"][GPU] == resources["limits"][GPU] == gpus[workload["metadata"]["name"]]
            assert any(t["key"] == GPU for t in pod["tolerations"])


@pytest.mark.parametrize("layout", ["base", "cpu-demo", "cpu-demo-elastic"])
def test_no_gpu_outside_the_gpu_overlay(rendered, layout):
    assert GPU not in yaml.safe_dump_all(rendered[layout])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_replica_counts(rendered, layout):
    workloads = [m for m in rendered[layout] if m["kind"] in {"Deployment", "StatefulSet"}]
    counts = {
        m["metadata"]["name"]: m["spec"]["replicas"] for m in workloads if m["metadata"]["name"] in REPLICAS[layout]
    }
    assert counts == REPLICAS[layout]


def test_overlays_set_the_device_and_a_smaller_kv_pool_on_cpu(rendered):
    config = {layout: _config(rendered[layout]) for layout in LAYOUTS}
    assert (config["cpu-demo"]["PDSERVE_DEVICE"], config["gpu"]["PDSERVE_DEVICE"]) == ("cpu", "cuda")
    for key in ("PDSERVE_PREFILL_KV_BLOCKS", "PDSERVE_DECODE_KV_BLOCKS"):
        assert int(config["cpu-demo"][key]) < int(config["base"][key]) < int(config["gpu"][key])
    assert config["gpu"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == config["base"]["OTEL_EXPORTER_OTLP_ENDPOINT"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pods_run_as_non_root_with_a_read_only_root(rendered, layout):
    for workload, pod in pod_templates(rendered[layout]):
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, workload["metadata"]["name"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_grace_period_outlasts_the_drain_timeout(rendered, layout):
    drain_s = int(_config(rendered[layout])["PDSERVE_DRAIN_TIMEOUT_S"])
    pdserve_pods = [
        pod for _, pod in pod_templates(rendered[layout]) if pod["containers"][0]["image"].startswith("pdserve")
    ]
    assert len(pdserve_pods) == 3
    for pod in pdserve_pods:
        assert pod["terminationGracePeriodSeconds"] >= drain_s + 10
        assert "--drain-timeout-s=$(PDSERVE_DRAIN_TIMEOUT_S)" in pod["containers"][0]["args"]


def test_overlays_only_retag_the_pdserve_image(rendered):
    images = {
        layout: sorted(c["image"] for _, p in pod_templates(rendered[layout]) for c in p["containers"])
        for layout in LAYOUTS
    }
    assert images["cpu-demo"] == images["gpu"] == images["base"]


def _config(manifests: list[dict]) -> dict[str, str]:
    return next(m["data"] for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "pdserve-config")
