"""`kubectl kustomize` renders the layouts (overlays patch the base, add nothing), and a missing or
refusing kubectl fails the tests instead of skipping them."""

from __future__ import annotations

import pytest
import yaml
from deploy_paths import LAYOUTS
from k8s_render import kustomize_yaml, render


def object_ids(manifests: list[dict]) -> list[tuple[str, str, str]]:
    return sorted((m["apiVersion"], m["kind"], m["metadata"]["name"]) for m in manifests)


@pytest.mark.parametrize("layout", [layout for layout in LAYOUTS if layout != "base"])
def test_overlays_patch_the_base_objects_and_add_none(rendered, layout):
    assert object_ids(rendered[layout]) == object_ids(rendered["base"])
    assert rendered[layout] != rendered["base"]


def test_a_missing_kubectl_fails_the_test_with_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="kubectl is not on PATH"):
        kustomize_yaml(tmp_path)


def test_a_kustomization_kubectl_refuses_fails_with_its_error(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["missing.yaml"]}))
    with pytest.raises(pytest.fail.Exception, match="missing.yaml"):
        render(tmp_path)


def test_render_applies_patches_replicas_and_images_as_kustomize_does(tmp_path):
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "pdserve:0.1.0"}]}}},
    }
    patch = {**deployment, "spec": {"template": {"spec": {"containers": [{"name": "c", "args": ["router"]}]}}}}
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(deployment))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(patch))
    spec = {
        "resources": ["d.yaml"],
        "patches": [{"path": "p.yaml"}],
        "replicas": [{"name": "d", "count": 3}],
        "images": [{"name": "pdserve", "newName": "reg/pdserve", "newTag": "2"}],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    [rendered] = render(tmp_path)
    assert rendered["spec"]["replicas"] == 3
    assert rendered["spec"]["template"]["spec"]["containers"] == [
        {"name": "c", "image": "reg/pdserve:2", "args": ["router"]}
    ]


def test_the_elastic_overlay_makes_every_worker_elastic_and_turns_the_planner_on(rendered):
    from deploy_contract import k8s_invocations

    commands = {invocation.role: invocation.flags for _, invocation in k8s_invocations(rendered["cpu-demo-elastic"])}
    assert commands["prefill"]["--elastic"] == commands["decode"]["--elastic"] == "on"
    assert commands["router"]["--planner"] == "on"
    plain = {invocation.role: invocation.flags for _, invocation in k8s_invocations(rendered["cpu-demo"])}
    assert "--elastic" not in plain["decode"] and "--planner" not in plain["router"]
