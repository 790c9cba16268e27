"""Rendered manifests for the deployment tests (paths live in deploy_paths.py).

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
from kustomize_lite import Manifest, render  # noqa: E402


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[Manifest]]:
    """Each layout (the base and every overlay) rendered once per session."""
    return {layout: render(layout_dir(layout)) for layout in LAYOUTS}
