"""Figures a machine measures about itself once, kept on disk beside the compiled kernels, so a
worker that starts again (a restart, a test fleet, a rescheduled pod on a node that already ran
one) reads them instead of measuring again.

    measured("products", {"shapes": ..., "threads": 1}, probe)   # probe() -> a JSON-able dict

    file:   <cache>/measured/<kind>-<key>.json   cache: pdserve/native/build.py's cache_dir()
    key:    sha256 of `depends_on` and of the machine (CPU model and features, torch's version and the
            instruction sets torch, oneDNN and MKL may use: ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA,
            MKL_ENABLE_INSTRUCTIONS narrow them)
    write:  the first writer wins (a temporary file linked into place, never replaced): processes
            that measured at the same time all use the one figure on disk, so a choice made from it
            (which layout multiplies, what calibration says) is the same in every process

An unwritable cache is not an error: the figure is measured, used and not kept.
PDSERVE_KEEP_MEASUREMENTS=0 measures every figure at every start, reading and keeping none.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pdserve.kept_file import keep_file

log = logging.getLogger(__name__)

FORMAT = 1  # bump when what a kind's file holds changes
# what limits the instruction sets oneDNN's and MKL's kernels use (torch's own: its CPU capability)
ISA_LIMITS = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def measured(kind: str, depends_on: dict[str, Any], measure: Callable[[], dict[str, Any]],
             cache: Path | None = None) -> dict[str, Any]:
    """The figure for `kind` on this machine given `depends_on`: read from the cache, else
    `measure()`d now and kept there (the one already kept, if another process kept one first)."""
    if os.environ.get("PDSERVE_KEEP_MEASUREMENTS", "1") == "0":
        return measure()
    path = (cache or _default_cache()) / "measured" / f"{kind}-{_key(kind, depends_on)}.json"
    found = _read(path)
    if found is not None:
        return found
    figure = measure()
    return _keep(path, figure)


def machine() -> dict[str, str]:
    """What a measured figure depends on about the machine itself."""
    import torch

    return {"cpu": _cpu_line("model name"), "features": _cpu_line("flags") or _cpu_line("Features"),
            "arch": platform.machine(), "cores": str(os.cpu_count()), "torch": torch.__version__,
            "isa": " ".join([torch.backends.cpu.get_cpu_capability(), *(os.environ.get(name, "") for name in ISA_LIMITS)])}


def _key(kind: str, depends_on: dict[str, Any]) -> str:
    text = json.dumps({"kind": kind, "format": FORMAT, "machine": machine(), **depends_on}, sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except OSError:  # none kept yet, or no cache folder
        return None
    except ValueError as exc:
        log.warning("measuring again: the figure in %s is unreadable: %s", path, exc)
        path.unlink(missing_ok=True)
        return None


def _keep(path: Path, figure: dict[str, Any]) -> dict[str, Any]:
    """Links `figure` into place unless a figure is there already; returns the one on disk."""
    try:
        keep_file(path, lambda f: json.dump(figure, f))
    except OSError as exc:
        log.warning("measured figures are not kept (%s): %s", path.parent, exc)
        return figure
    return _read(path) or figure


def _default_cache() -> Path:
    from pdserve.native.build import cache_dir

    return cache_dir()


def _cpu_line(field: str) -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() if field == "model name" else ""
