"""The test renderer behaves like kustomize on the features the overlays use."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_paths import LAYOUTS, layout_dir
from kustomize_lite import ResourceId, UnsupportedKustomization, render, split_image, strategic_merge

POD = {
    "containers": [
        {
            "name": "a",
            "image": "x:1",
            "args": ["one", "two"],
            "env": [{"name": "K", "value": "1"}],
            "ports": [{"name": "grpc", "containerPort": 1}],
        },
        {"name": "b", "image": "y:1"},
    ],
    "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
}


def test_merge_matches_containers_env_and_volumes_by_name():
    patch = {
        "containers": [{"name": "a", "env": [{"name": "K", "value": "2"}, {"name": "NEW", "value": "3"}]}],
        "volumes": [{"name": "shm", "emptyDir": {"sizeLimit": "8Gi"}}],
    }
    merged = strategic_merge(POD, patch)
    assert [c["name"] for c in merged["containers"]] == ["a", "b"]
    assert merged["containers"][0]["env"] == [{"name": "K", "value": "2"}, {"name": "NEW", "value": "3"}]
    assert merged["containers"][0]["image"] == "x:1"
    assert merged["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert POD["volumes"][0]["emptyDir"]["sizeLimit"] == "1Gi"


def test_merge_puts_patched_items_first_like_kubectl():
    base = {"volumes": [{"name": n} for n in "abc"]}
    patch = {"volumes": [{"name": "c", "x": 1}, {"name": "n"}, {"name": "a", "x": 2}]}
    merged = strategic_merge(base, patch)["volumes"]
    assert merged == [{"name": "c", "x": 1}, {"name": "n"}, {"name": "a", "x": 2}, {"name": "b"}]


def test_merge_replaces_plain_lists_and_deletes_null_keys():
    merged = strategic_merge(POD, {"containers": [{"name": "a", "args": ["three"], "env": None}]})
    assert merged["containers"][0]["args"] == ["three"]
    assert "env" not in merged["containers"][0]


def test_merge_matches_container_ports_by_number():
    merged = strategic_merge(
        POD, {"containers": [{"name": "a", "ports": [{"containerPort": 1, "protocol": "TCP"}, {"containerPort": 2}]}]}
    )
    assert merged["containers"][0]["ports"] == [
        {"name": "grpc", "containerPort": 1, "protocol": "TCP"},
        {"containerPort": 2},
    ]


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("pdserve:0.1.0", ("pdserve", "0.1.0")),
        ("reg:5000/team/pdserve:1", ("reg:5000/team/pdserve", "1")),
        ("pdserve", ("pdserve", "")),
    ],
)
def test_split_image(image, expected):
    assert split_image(image) == expected


def test_resource_id_ignores_the_api_version():
    manifest = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "w"}}
    assert ResourceId.of(manifest) == ResourceId("apps", "StatefulSet", "w")


def write_kustomization(folder: Path, spec: dict, files: dict[str, list[dict]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    for name, docs in files.items():
        (folder / name).write_text(yaml.safe_dump_all(docs))
    return folder


def deployment(name: str) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "pdserve:0.1.0"}]}}},
    }


def test_render_applies_patches_replicas_and_images(tmp_path):
    base = write_kustomization(tmp_path / "base", {"resources": ["d.yaml"]}, {"d.yaml": [deployment("d")]})
    patch = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "args": ["router"]}]}}},
    }
    spec = {
        "resources": ["../base"],
        "patches": [{"path": "p.yaml"}],
        "replicas": [{"name": "d", "count": 3}],
        "images": [{"name": "pdserve", "newName": "reg/pdserve", "newTag": "2"}],
    }
    overlay = write_kustomization(tmp_path / "overlay", spec, {"p.yaml": [patch]})
    [rendered] = render(overlay)
    assert rendered["spec"]["replicas"] == 3
    assert rendered["spec"]["template"]["spec"]["containers"][0] == {
        "name": "c",
        "image": "reg/pdserve:2",
        "args": ["router"],
    }
    assert render(base)[0]["spec"]["replicas"] == 1


@pytest.mark.parametrize(
    "spec",
    [
        {"resources": ["d.yaml"], "namePrefix": "x-"},
        {"resources": ["d.yaml"], "patches": [{"path": "d.yaml", "target": {"kind": "Deployment"}}]},
        {"resources": ["missing.yaml"]},
        {"resources": ["d.yaml"], "replicas": [{"name": "nothing", "count": 2}]},
        {"resources": ["d.yaml"], "patches": [{"path": "other.yaml"}]},
    ],
)
def test_render_refuses_what_it_cannot_render(tmp_path, spec):
    other = [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "other"}}]
    folder = write_kustomization(tmp_path, spec, {"d.yaml": [deployment("d")], "other.yaml": other})
    with pytest.raises(UnsupportedKustomization):
        render(folder)


def kubectl_kustomize(folder: Path) -> list[dict] | None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    try:
        result = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None
    return [d for d in yaml.safe_load_all(result.stdout) if d] if result.returncode == 0 else None


def by_id(manifests: list[dict]) -> dict[ResourceId, dict]:
    return {ResourceId.of(m): m for m in manifests}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_render_agrees_with_kubectl_kustomize(rendered, layout):
    reference = kubectl_kustomize(layout_dir(layout))
    if reference is None:
        pytest.skip("kubectl with built-in kustomize is not available")
    assert by_id(rendered[layout]) == by_id(reference)
