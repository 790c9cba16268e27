"""A CPU worker's memory limit holds its KV pools full, not only what it touches at start.

A CPU pool is committed page by page as it is written (pdserve/kv/host_memory.py), so a limit
below the pools' size does not stop the pod at start: it kills it under load, when the pools
fill. Every layout whose workers keep their pools in host memory must leave room for both pools
of the embedded model and the rest of the process.
"""

from __future__ import annotations

import re

import pytest
from deploy_paths import LAYOUTS
from k8s_render import pod_templates

from pdserve.config import CacheConfig
from pdserve.model.metadata import read_model_config

# A worker's memory beside its pools: 1.6 GB RSS for a prefill worker with untouched pools
# (weights dense and packed, torch, the tokenizer; docs/BENCHMARKS.md, "Worker start: the KV
# pools"), and room for a step's activations and logits.
REST_BYTES = 2 << 30
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
ROLES = ("prefill", "decode")


def quantity_bytes(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([KMGT]i?)?", text).groups()
    return int(number) * UNITS.get(unit, 1)


def flag(args: list[str], name: str, config: dict[str, str]) -> str | None:
    """The value of `--name=...` in args, with $(VAR) taken from the ConfigMap."""
    for arg in args:
        if arg.startswith(f"--{name}="):
            return re.sub(r"\$\((\w+)\)", lambda m: config[m.group(1)], arg.split("=", 1)[1])
    return None


def workers(manifests: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for _, pod in pod_templates(manifests) for c in pod["containers"] if c["name"] in ROLES}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cpu_workers_have_room_for_both_pools_full(rendered, layout):
    config = next(m for m in rendered[layout] if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "pdserve-config")
    data = config["data"]
    containers = workers(rendered[layout])
    assert set(containers) == set(ROLES)
    for role, container in containers.items():
        if flag(container["args"], "device", data) == "cpu":
            need, limit = pools_bytes(container["args"], data) + REST_BYTES, limit_bytes(container)
            assert need <= limit, f"{layout} {role}: needs {need / 2**30:.2f} GiB, limited to {limit / 2**30:.2f}"


def pools_bytes(args: list[str], data: dict[str, str]) -> int:
    """Both pools of the embedded model, full (a CPU worker serves it unless PDSERVE_MODEL says)."""
    assert "PDSERVE_MODEL" not in data, "a CPU worker of a model this test cannot size"
    defaults = CacheConfig()
    block_size = int(flag(args, "block-size", data) or defaults.block_size)
    blocks = int(flag(args, "kv-blocks", data) or defaults.num_blocks)
    host_blocks = int(flag(args, "host-kv-blocks", data) or defaults.num_host_blocks)
    block_bytes = read_model_config(None).kv_shape(block_size).block_numel() * 4  # float32 on a CPU
    return (blocks + host_blocks) * block_bytes


def limit_bytes(container: dict) -> int:
    return quantity_bytes(container["resources"]["limits"]["memory"])
