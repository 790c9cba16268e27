"""A small kustomize: enough to render deploy/k8s offline for the tests.

Implements the kustomization fields the overlays use, `resources` (files and directories),
`patches` (strategic-merge patch files, the target taken from each patch's kind and name),
`replicas` and `images` (newName, newTag), and raises UnsupportedKustomization on anything
else, so an overlay that grows a feature this renderer lacks fails its test instead of being
rendered wrongly. kubectl's built-in kustomize stays the renderer for real deployments; a test
compares the two where kubectl exists.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

Manifest = dict[str, Any]

KUSTOMIZATION_FIELDS = frozenset({"apiVersion", "kind", "resources", "patches", "replicas", "images"})
NAME_KEYED_LISTS = frozenset({"containers", "initContainers", "env", "volumes", "volumeMounts"})
PORT_KEYS = ("containerPort", "port")
SCALABLE_KINDS = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"})
POD_TEMPLATE_KINDS = SCALABLE_KINDS | {"DaemonSet", "Job"}


class UnsupportedKustomization(ValueError):
    """The kustomization uses a feature this renderer does not implement, or points nowhere."""


@dataclass(frozen=True)
class ResourceId:
    """How kustomize matches a patch to a resource: API group, kind and name."""

    group: str
    kind: str
    name: str

    @classmethod
    def of(cls, manifest: Manifest) -> ResourceId:
        group = manifest["apiVersion"].rpartition("/")[0]
        return cls(group, manifest["kind"], manifest["metadata"]["name"])


def load_documents(path: Path) -> list[Manifest]:
    """Every non-empty YAML document of a file."""
    with path.open() as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc]


def render(directory: Path) -> list[Manifest]:
    """The manifests a kustomization directory renders to, in resource order."""
    spec = _load_kustomization(directory)
    manifests = [m for entry in spec.get("resources", []) for m in _load_resource(directory / entry)]
    for entry in spec.get("patches", []):
        manifests = _apply_patch_file(manifests, directory, entry)
    for entry in spec.get("replicas", []):
        _set_replicas(manifests, entry)
    for entry in spec.get("images", []):
        _set_image(manifests, entry)
    return manifests


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    """Kubernetes strategic merge for the shapes used here: maps merge key by key (a null value
    deletes the key), lists of containers/env/volumes/mounts/ports merge by their key (see
    _merge_lists for the order), any other list or scalar is replaced by the patch's."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return _merge_maps(base, patch)
    if isinstance(base, list) and isinstance(patch, list):
        key = _list_merge_key(field, [*base, *patch])
        if key is not None:
            return _merge_lists(base, patch, key)
    return copy.deepcopy(patch)


def pod_templates(manifests: Iterable[Manifest]) -> Iterator[tuple[Manifest, Manifest]]:
    """(workload, pod spec) for every manifest that holds a pod template."""
    for manifest in manifests:
        if manifest["kind"] in POD_TEMPLATE_KINDS:
            yield manifest, manifest["spec"]["template"]["spec"]


def _load_kustomization(directory: Path) -> Manifest:
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise UnsupportedKustomization(f"no kustomization.yaml in {directory}")
    spec = load_documents(path)[0]
    unknown = set(spec) - KUSTOMIZATION_FIELDS
    if unknown:
        raise UnsupportedKustomization(f"{path}: unsupported fields {sorted(unknown)}")
    return spec


def _load_resource(path: Path) -> list[Manifest]:
    if path.is_dir():
        return render(path)
    if path.is_file():
        return load_documents(path)
    raise UnsupportedKustomization(f"resource {path} does not exist")


def _apply_patch_file(manifests: list[Manifest], directory: Path, entry: Manifest) -> list[Manifest]:
    if set(entry) != {"path"}:
        raise UnsupportedKustomization(f"only `patches: - path: FILE` is supported, got {entry}")
    for patch in load_documents(directory / entry["path"]):
        manifests = _apply_patch(manifests, patch)
    return manifests


def _apply_patch(manifests: list[Manifest], patch: Manifest) -> list[Manifest]:
    target = ResourceId.of(patch)
    matches = [m for m in manifests if ResourceId.of(m) == target]
    if len(matches) != 1:
        raise UnsupportedKustomization(f"patch target {target} matches {len(matches)} resources")
    return [strategic_merge(m, patch) if m is matches[0] else m for m in manifests]


def _set_replicas(manifests: list[Manifest], entry: Manifest) -> None:
    targets = [m for m in manifests if m["kind"] in SCALABLE_KINDS and m["metadata"]["name"] == entry["name"]]
    if not targets:
        raise UnsupportedKustomization(f"replicas: nothing named {entry['name']} to scale")
    for manifest in targets:
        manifest["spec"]["replicas"] = int(entry["count"])


def _set_image(manifests: list[Manifest], entry: Manifest) -> None:
    unknown = set(entry) - {"name", "newName", "newTag"}
    if unknown:
        raise UnsupportedKustomization(f"images: unsupported fields {sorted(unknown)}")
    for _, pod in pod_templates(manifests):
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            name, tag = split_image(container["image"])
            if name == entry["name"]:
                new_tag = entry.get("newTag", tag)
                container["image"] = entry.get("newName", name) + (f":{new_tag}" if new_tag else "")


def split_image(image: str) -> tuple[str, str]:
    """'registry:5000/repo/name:tag' -> ('registry:5000/repo/name', 'tag'); no tag -> ''."""
    head, _, last = image.rpartition("/")
    name, _, tag = last.partition(":")
    return (f"{head}/{name}" if head else name), tag


def _merge_maps(base: Manifest, patch: Manifest) -> Manifest:
    merged = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif key in merged:
            merged[key] = strategic_merge(merged[key], value, key)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _list_merge_key(field: str, items: list[Any]) -> str | None:
    if not all(isinstance(item, dict) for item in items):
        return None
    if field in NAME_KEYED_LISTS:
        return "name"
    if field == "ports":
        return next((key for key in PORT_KEYS if all(key in item for item in items)), None)
    return None


def _merge_lists(base: list[Manifest], patch: list[Manifest], key: str) -> list[Manifest]:
    """As kubectl's kustomize orders them: the patch's items first (merged into their base item
    when there is one), then the base's other items, each group in its own order."""
    base_items = {item[key]: item for item in base}
    patched = [strategic_merge(base_items[i[key]], i) if i[key] in base_items else copy.deepcopy(i) for i in patch]
    patched_keys = {item[key] for item in patch}
    return patched + [copy.deepcopy(item) for item in base if item[key] not in patched_keys]
