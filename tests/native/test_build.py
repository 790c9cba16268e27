"""The builder (pdserve/native/build.py): a library built once and then loaded without running the
compiler; another compiler, or the same one changed in place, and another CPU each get their own;
an image's prebuilt libraries load without a compiler, and a library is refused on a CPU without
its target's features."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

import pytest

from pdserve.native import build, target
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
    monkeypatch.setattr(build, "cpu_features_line", lambda: "flags : another CPU")
    load_library(source)
    assert len(libraries(source)) == 2


@pytest.mark.timeout(60)
def test_a_library_built_behind_is_built_once_and_loaded_without_the_compiler(source, monkeypatch):
    compiles = []
    compile_now = build._compile
    monkeypatch.setattr(build, "_compile", lambda *a: (compiles.append(a[1]), compile_now(*a)))
    behind = build.build_behind([source])
    assert load_library(source).pdserve_answer() == 42  # built here or waited for: either way once
    behind.join(30)
    assert not behind.is_alive()
    assert compiles == [source] and len(libraries(source)) == 1


@pytest.mark.timeout(60)
def test_a_failed_build_behind_is_left_for_the_load_to_report(source, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler")
    behind = build.build_behind([source])
    behind.join(30)
    assert not behind.is_alive()
    with pytest.raises(build.NativeBuildError, match="no C compiler"):
        load_library(source)


def test_a_missing_compiler_says_so(source, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler")
    with pytest.raises(build.NativeBuildError, match="no C compiler .no-such-compiler not found"):
        load_library(source)


X86 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 targets")


@pytest.fixture()
def prebuilt(source, tmp_path, monkeypatch) -> Path:
    """`source` built for plain x86-64 (every x86 CPU runs it) into an image's folder, and this
    process set to load from there with no compiler."""
    into = tmp_path / "image-kernels"
    [library] = build.prebuild([source], into, "x86-64")
    assert library.parent == into and target.read_needs(library) == frozenset()  # SSE2 only: nothing checked
    monkeypatch.setenv("PDSERVE_NATIVE_ARCH", "x86-64")
    monkeypatch.setenv("PDSERVE_NATIVE_PREBUILT", str(into))
    monkeypatch.setenv("CC", "no-such-compiler")
    return into


@X86
def test_a_prebuilt_library_loads_without_a_compiler_and_builds_nothing(prebuilt, source):
    build.build_behind([source]).join(30)
    assert load_library(source).pdserve_answer() == 42
    assert not (source.parent / "cache").exists()


@X86
def test_a_prebuilt_folder_of_another_source_is_passed_over_for_the_cache(prebuilt, source, monkeypatch):
    source.write_text("int pdserve_answer(void) { return 43; }\n")  # the image's kernels are of another version
    monkeypatch.delenv("CC")
    assert load_library(source).pdserve_answer() == 43
    assert len(libraries(source)) == 1


def test_a_prebuilt_library_needs_an_explicit_target(source, tmp_path):
    with pytest.raises(build.NativeBuildError, match="explicit target"):
        build.prebuild([source], tmp_path / "image-kernels", "native")


@X86
def test_the_needs_of_a_target_are_the_features_its_compiler_enables():
    compiler = shutil.which("cc") or shutil.which("gcc")
    v3 = target.needs_of(compiler, "x86-64-v3", 60)
    assert {"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"} <= v3
    assert not any(flag.startswith("avx512") for flag in v3)
    assert {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"} <= target.needs_of(compiler, "x86-64-v4", 60)
    with pytest.raises(target.TargetError, match="does not know -march=no-such-cpu"):
        target.needs_of(compiler, "no-such-cpu", 60)


@X86
def test_a_library_whose_target_this_cpu_lacks_is_refused_before_it_loads(source, monkeypatch):
    monkeypatch.setenv("PDSERVE_NATIVE_ARCH", "x86-64-v3")
    monkeypatch.setattr(target, "cpu_flags", lambda: frozenset({"fpu", "sse", "sse2"}))
    loaded = []
    monkeypatch.setattr(build.ctypes, "CDLL", loaded.append)
    with pytest.raises(build.NativeBuildError, match="built for -march=x86-64-v3, which needs .*avx2.*this CPU lacks"):
        load_library(source)
    assert loaded == []


@X86
def test_an_explicit_target_is_one_library_for_every_cpu_that_runs_it(source, monkeypatch):
    monkeypatch.setenv("PDSERVE_NATIVE_ARCH", "x86-64")
    load_library(source)
    monkeypatch.setattr(build, "cpu_features_line", lambda: "flags : another CPU")
    load_library(source)
    assert len(libraries(source)) == 1
