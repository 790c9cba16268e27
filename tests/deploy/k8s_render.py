"""deploy/k8s rendered by kubectl's built-in kustomize (`kubectl kustomize DIR`: offline, no cluster).

kubectl is installed wherever these tests run (v1.32, kustomize v5.5): without it they fail, they
do not skip, so a deployment change is never left unchecked.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

Manifest = dict[str, Any]

POD_TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController", "DaemonSet", "Job"})
KUSTOMIZE_TIMEOUT_S = 120


def find_kubectl() -> str:
    """kubectl on PATH; fails the calling test with what to install when there is none."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not on PATH: the deployment tests render deploy/k8s with `kubectl kustomize` "
                    "(install kubectl >= 1.27, which has kustomize built in)", pytrace=False)
    return kubectl


def kustomize_yaml(directory: Path) -> str:
    """The YAML `kubectl kustomize DIRECTORY` prints; fails the test with kubectl's error if it refuses."""
    command = [find_kubectl(), "kustomize", str(directory)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=KUSTOMIZE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{' '.join(command)}` ran over {KUSTOMIZE_TIMEOUT_S} s", pytrace=False)
    if done.returncode != 0:
        pytest.fail(f"`{' '.join(command)}` exited {done.returncode}:\n{done.stderr}", pytrace=False)
    return done.stdout


def parse(text: str) -> list[Manifest]:
    """The non-empty YAML documents of rendered output, in order."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(directory: Path) -> list[Manifest]:
    """The manifests a kustomization directory renders to, in kubectl's order."""
    return parse(kustomize_yaml(directory))


def pod_templates(manifests: Iterable[Manifest]) -> Iterator[tuple[Manifest, Manifest]]:
    """(workload, pod spec) for every manifest that holds a pod template."""
    for manifest in manifests:
        if manifest["kind"] in POD_TEMPLATE_KINDS:
            yield manifest, manifest["spec"]["template"]["spec"]
