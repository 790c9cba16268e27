"""The rendered objects point at each other correctly: selectors, ports, DNS names, variables."""

from __future__ import annotations

import pytest
from deploy_contract import GENERATED_SECRET_KEYS, k8s_invocations, referenced_variables
from deploy_paths import LAYOUTS
from k8s_render import Manifest, pod_templates

FILE_FLAGS = ("--tls-cert", "--tls-key", "--tls-ca", "--cluster-token-file", "--api-token-file")


def workloads(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m, _ in pod_templates(manifests)]


def selected_by(selector: dict[str, str], manifests: list[Manifest]) -> list[Manifest]:
    return [w for w in workloads(manifests) if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]


def named(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    return next(m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name)


def container_port_names(workload: Manifest) -> set[str]:
    return {p["name"] for c in workload["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_workload_selectors_match_their_own_pod_labels(rendered, layout):
    for workload in workloads(rendered[layout]):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert selected_by(workload["spec"]["selector"]["matchLabels"], rendered[layout]) == [workload]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_services_select_one_workload_and_target_named_ports(rendered, layout):
    services = [m for m in rendered[layout] if m["kind"] == "Service"]
    assert len(services) == 5
    for service in services:
        targets = selected_by(service["spec"]["selector"], rendered[layout])
        assert len(targets) == 1, service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in container_port_names(targets[0]), (service["metadata"]["name"], port)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_disruption_budgets_cover_each_pdserve_role(rendered, layout):
    budgets = [m for m in rendered[layout] if m["kind"] == "PodDisruptionBudget"]
    covered = {
        selected_by(b["spec"]["selector"]["matchLabels"], rendered[layout])[0]["metadata"]["name"] for b in budgets
    }
    assert covered == {"pdserve-router", "pdserve-prefill", "pdserve-decode"}
    assert all(b["spec"]["maxUnavailable"] == 1 for b in budgets)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_statefulsets_are_governed_by_headless_services(rendered, layout):
    for workload in workloads(rendered[layout]):
        if workload["kind"] != "StatefulSet":
            continue
        service = named(rendered[layout], "Service", workload["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None"
        assert selected_by(service["spec"]["selector"], rendered[layout]) == [workload]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_router_discovers_workers_through_their_headless_services(rendered, layout):
    calls = {call.role: call for _, call in k8s_invocations(rendered[layout])}
    for role in ("prefill", "decode"):
        name, _, port = calls["router"].flags[f"--{role}-dns"].partition(":")
        service = named(rendered[layout], "Service", name)
        assert service["spec"]["clusterIP"] == "None"
        assert int(port) in {p["port"] for p in service["spec"]["ports"]}
        assert calls[role].flags["--port"] == port
        assert selected_by(service["spec"]["selector"], rendered[layout])[0]["metadata"]["name"] == f"pdserve-{role}"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_workers_advertise_their_stable_statefulset_dns_name(rendered, layout):
    for _, call in k8s_invocations(rendered[layout]):
        if call.role != "router":
            service = named(rendered[layout], "StatefulSet", f"pdserve-{call.role}")["spec"]["serviceName"]
            assert call.flags["--advertise-host"] == f"$(POD_NAME).{service}.$(POD_NAMESPACE).svc"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_variable_reference_is_defined_before_use(rendered, layout):
    config_maps = {m["metadata"]["name"]: m["data"] for m in rendered[layout] if m["kind"] == "ConfigMap"}
    for workload, pod in pod_templates(rendered[layout]):
        for container in pod["containers"]:
            defined = {k for ref in container.get("envFrom", []) for k in config_maps[ref["configMapRef"]["name"]]}
            for variable in container.get("env", []):
                assert referenced_variables(variable.get("value", "")) <= defined, variable
                defined.add(variable["name"])
                _assert_config_key_exists(variable, config_maps)
            missing = referenced_variables(" ".join(container.get("args", []))) - defined
            assert not missing, (workload["metadata"]["name"], missing)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_files_named_by_flags_are_mounted_from_the_documented_secrets(rendered, layout):
    for container, call in k8s_invocations(rendered[layout]):
        pod = named(rendered[layout], _kind_of(call.where), call.where.split("/")[1])["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for flag in FILE_FLAGS:
            if flag in call.flags:
                secret, key = _secret_file(call.flags[flag], container, volumes)
                assert secret in GENERATED_SECRET_KEYS, (call.where, flag)
                assert key in _exposed_keys(volumes, secret), (call.where, flag)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_volume_mounts_name_existing_volumes_and_configmaps(rendered, layout):
    config_maps = {m["metadata"]["name"] for m in rendered[layout] if m["kind"] == "ConfigMap"}
    for _, pod in pod_templates(rendered[layout]):
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            assert {m["name"] for m in container.get("volumeMounts", [])} <= set(volumes)
        for volume in volumes.values():
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps


def test_workers_get_only_the_cluster_token(rendered):
    for _, call in k8s_invocations(rendered["base"]):
        assert ("--api-token-file" in call.flags) == (call.role == "router")
        assert "--cluster-token-file" in call.flags


def _assert_config_key_exists(variable: Manifest, config_maps: dict[str, dict[str, str]]) -> None:
    ref = variable.get("valueFrom", {}).get("configMapKeyRef")
    if ref is not None:
        assert ref["key"] in config_maps[ref["name"]]


def _kind_of(where: str) -> str:
    return where.split("/")[0]


def _secret_file(path: str, container: Manifest, volumes: dict[str, Manifest]) -> tuple[str, str]:
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/"))
    assert mount.get("readOnly") is True
    return volumes[mount["name"]]["secret"]["secretName"], path[len(mount["mountPath"]) :].strip("/")


def _exposed_keys(volumes: dict[str, Manifest], secret: str) -> set[str]:
    """Paths a secret volume shows: its `items` when given, else every key the generator writes."""
    volume = next(v for v in volumes.values() if v.get("secret", {}).get("secretName") == secret)
    items = volume["secret"].get("items")
    if items:
        return {item["path"] for item in items}
    return set(GENERATED_SECRET_KEYS[secret])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_routers_are_a_tier_of_at_least_two_that_disruptions_and_nodes_never_take_whole(rendered, layout):
    router = named(rendered[layout], "Deployment", "pdserve-router")
    budget = next(b for b in rendered[layout] if b["kind"] == "PodDisruptionBudget"
                  and selected_by(b["spec"]["selector"]["matchLabels"], rendered[layout]) == [router])
    assert router["spec"]["replicas"] >= 2
    assert router["spec"]["replicas"] - budget["spec"]["maxUnavailable"] >= 1  # one stays through a disruption
    assert router["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0  # and through a rollout
    spread = router["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert selected_by(term["labelSelector"]["matchLabels"], rendered[layout]) == [router]
