"""The collector configs are wired: pdserve -> collector (OTLP) -> batch -> Jaeger (OTLP)."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
import yaml
from deploy_paths import DEPLOY, DOCKER, LAYOUTS, README

LOCAL_CONFIG = DEPLOY / "otel" / "collector.yaml"
SECTIONS = ("receivers", "processors", "exporters")


def local_config() -> dict:
    return yaml.safe_load(LOCAL_CONFIG.read_text())


def k8s_config(manifests: list[dict]) -> dict:
    config_map = named(manifests, "ConfigMap", "pdserve-otel-collector")
    return yaml.safe_load(config_map["data"]["collector.yaml"])


def named(manifests: list[dict], kind: str, name: str) -> dict:
    return next(m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name)


def component_type(name: str) -> str:
    """'otlp/jaeger' -> 'otlp' (the collector's type/name component ids)."""
    return name.split("/")[0]


def port_of(endpoint: str) -> int:
    return int(endpoint.rpartition(":")[2])


def jaeger_exporter(config: dict) -> dict:
    [name] = config["service"]["pipelines"]["traces"]["exporters"]
    assert component_type(name) == "otlp"
    return config["exporters"][name]


def assert_wired(config: dict) -> None:
    used = {section: set() for section in SECTIONS}
    for pipeline in config["service"]["pipelines"].values():
        for section in SECTIONS:
            assert pipeline[section], section
            assert set(pipeline[section]) <= set(config[section]), (section, pipeline[section])
            used[section] |= set(pipeline[section])
    for section in SECTIONS:
        assert used[section] == set(config[section]), f"{section} defined but unused"
    assert set(config["service"].get("extensions", [])) <= set(config.get("extensions", {}))


def test_local_config_pipeline_is_wired():
    config = local_config()
    assert_wired(config)
    traces = config["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"]
    assert traces["processors"][-1] == "batch"
    assert traces["processors"][0] == "memory_limiter"  # the collector's advice: first in line


def test_otlp_receiver_listens_on_all_interfaces_for_grpc_and_http():
    protocols = local_config()["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"] == "0.0.0.0:4317"
    assert protocols["http"]["endpoint"] == "0.0.0.0:4318"


def test_local_config_exports_to_the_compose_jaeger_over_otlp_grpc():
    exporter = jaeger_exporter(local_config())
    host, _, port = exporter["endpoint"].partition(":")
    services = yaml.safe_load((DOCKER / "docker-compose.yaml").read_text())["services"]
    assert host == "jaeger" and port == "4317"
    assert services[host]["image"].startswith("jaegertracing/all-in-one:")
    assert exporter["tls"]["insecure"] is True


@pytest.mark.parametrize("layout", LAYOUTS)
def test_k8s_config_is_the_local_one_pointed_at_the_jaeger_service(rendered, layout):
    config, reference = k8s_config(rendered[layout]), local_config()
    assert_wired(config)
    host = jaeger_exporter(config)["endpoint"].partition(":")[0]
    jaeger_exporter(reference)["endpoint"] = jaeger_exporter(config)["endpoint"]
    assert config == reference
    service = named(rendered[layout], "Service", host)
    assert 4317 in {p["port"] for p in service["spec"]["ports"]}
    jaeger = named(rendered[layout], "Deployment", host)["spec"]["template"]["spec"]["containers"][0]
    assert 4317 in {p["containerPort"] for p in jaeger["ports"]}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pdserve_pods_export_to_the_collector_service(rendered, layout):
    endpoint = urlparse(named(rendered[layout], "ConfigMap", "pdserve-config")["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"])
    service = named(rendered[layout], "Service", endpoint.hostname)
    [port] = [p for p in service["spec"]["ports"] if p["port"] == endpoint.port]
    collector = named(rendered[layout], "Deployment", endpoint.hostname)["spec"]["template"]["spec"]["containers"][0]
    [target] = [p for p in collector["ports"] if p["name"] == port["targetPort"]]
    receiver = k8s_config(rendered[layout])["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert target["containerPort"] == port_of(receiver)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_collector_reads_the_mounted_config_and_is_probed_on_its_health_extension(rendered, layout):
    pod = named(rendered[layout], "Deployment", "pdserve-otel-collector")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    config_path = next(a for a in container["args"] if a.startswith("--config=")).partition("=")[2]
    mount = next(m for m in container["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == "pdserve-otel-collector"
    assert config_path.rpartition("/")[2] == "collector.yaml"
    health = port_of(k8s_config(rendered[layout])["extensions"]["health_check"]["endpoint"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[container["readinessProbe"]["httpGet"]["port"]] == health


def test_compose_mounts_the_local_config_and_points_pdserve_at_the_collector():
    services = yaml.safe_load((DOCKER / "docker-compose.yaml").read_text())["services"]
    collector = services["otel-collector"]
    config_path = collector["command"][0].partition("=")[2]
    source, target, _ = collector["volumes"][0].split(":")
    assert (DOCKER / source).resolve() == LOCAL_CONFIG
    assert target == config_path
    for role in ("router", "prefill", "decode"):
        endpoint = urlparse(services[role]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert (endpoint.hostname, endpoint.port) == ("otel-collector", 4317)
        assert services[role]["environment"]["OTEL_SERVICE_NAME"] == f"pdserve-{role}"


def test_readme_says_how_to_see_a_trace():
    text = README.read_text()
    for needed in (
        "-p 16686:16686",
        "-p 4317:4317",
        "--otlp-traces-endpoint",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "pdserve-router",
        "pdserve.generate",
        "http://localhost:16686",
    ):
        assert needed in text, needed
