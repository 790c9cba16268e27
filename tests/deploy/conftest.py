"""Manifests rendered by `kubectl kustomize` for the deployment tests (paths live in deploy_paths.py).

The helper modules beside this file are imported by name under either import mode.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from deploy_paths import LAYOUTS, layout_dir  # noqa: E402
from k8s_render import Manifest, kustomize_yaml, parse  # noqa: E402


@pytest.fixture(scope="session")
def rendered_yaml() -> dict[str, str]:
    """Each layout (the base and every overlay) as `kubectl kustomize` prints it, once per session."""
    return {layout: kustomize_yaml(layout_dir(layout)) for layout in LAYOUTS}


@pytest.fixture(scope="session")
def rendered(rendered_yaml) -> dict[str, list[Manifest]]:
    """Each layout's rendered manifests."""
    return {layout: parse(text) for layout, text in rendered_yaml.items()}
