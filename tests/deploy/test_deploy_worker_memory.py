"""A CPU worker's memory limit holds its KV pools full, not only what it touches at start.

A CPU pool is committed page by page as it is written (pdserve/kv/host_memory.py), so a limit
below the pools' size does not stop the pod at start: it kills it under load, when the pools
fill. Every layout whose workers keep their pools in host memory must leave room for both pools
of the embedded model and the rest of the process.
"""

from __future__ import annotations

import re

import pytest
from k8s_render import Manifest, pod_templates
from test_deploy_tp_sizing import config_map, workers

from pdserve.config import EngineConfig
from pdserve.checkpoint.source import read_model_config

CPU_LAYOUTS = ("base", "cpu-demo")  # the GPU overlay's pools are sized by test_deploy_tp_sizing.py
# A worker's memory beside its pools: 1.6 GB RSS for a prefill worker with untouched pools
# (weights dense and packed, torch, the tokenizer; docs/BENCHMARKS.md, "Worker start: the KV
# pools"), 0.54 GB more for the panels of decode steps' products (--weight-layout auto; "Panels for
# few rows and a fused decode step"), and room for a step's activations and logits.
REST_BYTES = 5 << 29  # 2.5 GiB
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


@pytest.mark.parametrize("layout", CPU_LAYOUTS)
def test_cpu_workers_have_room_for_both_pools_full(rendered, layout):
    assert "PDSERVE_MODEL" not in config_map(rendered[layout]), "a model other than the embedded one"
    limits = memory_limits(rendered[layout])
    for role, (config, _) in workers(rendered, layout).items():
        assert config.device == "cpu", role
        need, limit = pools_bytes(config) + REST_BYTES, limits[role]
        assert need <= limit, f"{layout} {role}: needs {need / 2**30:.2f} GiB, limited to {limit / 2**30:.2f}"


def pools_bytes(config: EngineConfig) -> int:
    """Both pools of the embedded model, full, in float32 (a CPU's dtype)."""
    cache = config.cache
    block_bytes = read_model_config(None).kv_shape(cache.block_size).block_numel() * 4
    return (cache.num_blocks + cache.num_host_blocks) * block_bytes


def memory_limits(manifests: list[Manifest]) -> dict[str, int]:
    """Worker role -> its container's memory limit in bytes."""
    return {c["name"]: quantity_bytes(c["resources"]["limits"]["memory"]) for _, pod in pod_templates(manifests)
            for c in pod["containers"] if c["name"] in ("prefill", "decode")}


def quantity_bytes(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([KMGT]i?)?", text).groups()
    return int(number) * UNITS.get(unit, 1)
