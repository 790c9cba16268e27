"""The builder (pdserve/native/build.py): a library built once and then loaded without running the
compiler; another compiler, or the same one changed in place, and another CPU each get their own."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pdserve.native import build
from pdserve.native.build import load_library


@pytest.fixture()
def source(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "answer.c"
    path.write_text("int pdserve_answer(void) { return 42; }\n")
    return path


def libraries(source: Path) -> list[str]:
    return sorted(p.name for p in (source.parent / "cache").glob(f"{source.stem}-*.so"))


def test_a_cached_library_loads_without_running_the_compiler(source, monkeypatch):
    assert load_library(source).pdserve_answer() == 42

    def refuse(argv, **_):
        raise AssertionError(f"ran {argv} for a cached library")

    monkeypatch.setattr(build.subprocess, "run", refuse)
    assert load_library(source).pdserve_answer() == 42
    assert len(libraries(source)) == 1


def test_another_compiler_or_the_same_one_changed_builds_its_own(source, tmp_path, monkeypatch):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("no C compiler here; install gcc or set CC")
    load_library(source)
    wrapper = tmp_path / "cc-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec {compiler} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    load_library(source)
    os.utime(wrapper, ns=(0, 0))  # the same path, another file: an upgrade in place
    assert load_library(source).pdserve_answer() == 42
    assert len(libraries(source)) == 3


def test_a_library_built_for_one_cpu_is_not_loaded_on_another(source, monkeypatch):
    load_library(source)
    monkeypatch.setattr(build, "_cpu_features", lambda: "flags : another CPU")
    load_library(source)
    assert len(libraries(source)) == 2


def test_a_missing_compiler_says_so(source, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler")
    with pytest.raises(build.NativeBuildError, match="no C compiler .no-such-compiler not found"):
        load_library(source)
