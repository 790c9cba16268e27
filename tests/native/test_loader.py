"""The one loader (pdserve/native/loader.py): a kernel that builds comes back wrapped, silently; one
that cannot comes back with why, logged once per process at WARNING with what doing without costs."""

from __future__ import annotations

import logging

from pdserve.native import loader
from pdserve.native.layer_kernels import LayerKernelsLibrary
from pdserve.native.loader import Kernel, load_kernel, warn_fallback


def test_a_fallback_is_logged_once_with_the_reason_and_the_cost(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")
    kernel = Kernel("layer_kernels.c", "the test's kernel", "the slow path, slower steps")
    with caplog.at_level(logging.INFO, logger=loader.log.name):
        first = load_kernel(kernel, LayerKernelsLibrary)
        again = load_kernel(kernel, LayerKernelsLibrary)
        warn_fallback(kernel, "it computes wrongly here")
    assert first.kernel is None and again.kernel is None and "/bin/false" in first.problem
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == loader.log.name] == [
        (logging.WARNING, f"the test's kernel unavailable ({first.problem}): the slow path, slower steps")]


def test_a_kernel_that_builds_comes_back_wrapped_and_says_nothing(caplog):
    kernel = Kernel("layer_kernels.c", "the test's other kernel", "the slow path")
    with caplog.at_level(logging.INFO, logger=loader.log.name):
        loaded = load_kernel(kernel, LayerKernelsLibrary)
    assert isinstance(loaded.kernel, LayerKernelsLibrary) and loaded.problem is None
    assert [r for r in caplog.records if r.name == loader.log.name] == []
