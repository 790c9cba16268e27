"""Where the deployment files live, and the layouts the Kubernetes tests render."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
DOCKER = DEPLOY / "docker"
README = DEPLOY / "README.md"
LAYOUTS = ("base", "cpu-demo", "cpu-demo-elastic", "gpu")


def layout_dir(layout: str) -> Path:
    """deploy/k8s/base for 'base', deploy/k8s/overlays/NAME for an overlay."""
    return K8S / "base" if layout == "base" else K8S / "overlays" / layout
