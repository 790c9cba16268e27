"""The GPU overlay's prefill and decode workers run at tensor parallel size 4 with four GPUs, as
the real CLI parses their command line; every other layout's workers at size 1."""

from __future__ import annotations

import pytest
from k8s_render import pod_templates
from test_deploy_gpu_defaults import k8s_workers

from pdserve.cli import main
from pdserve.cli.options import engine_config

SIZES = {"base": {"prefill": 1, "decode": 1}, "cpu-demo": {"prefill": 1, "decode": 1},
         "gpu": {"prefill": 4, "decode": 4}}


def sizes(manifests) -> dict[str, int]:
    return {words[next(i for i, w in enumerate(words) if not w.startswith("-"))]:
            engine_config(main.build_parser().parse_args(words)).tensor_parallel_size
            for words in k8s_workers(manifests)}


@pytest.mark.parametrize("layout", sorted(SIZES))
def test_each_layout_s_workers_run_at_their_tensor_parallel_size(rendered, layout):
    assert sizes(rendered[layout]) == SIZES[layout]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_gpu_worker_pod_holds_one_gpu_per_rank(rendered, role):
    (spec,) = [spec for workload, spec in pod_templates(rendered["gpu"]) if workload["metadata"]["name"] == f"pdserve-{role}"]
    (container,) = [c for c in spec["containers"] if c["name"] == role]
    resources = container["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "4"
    assert sizes(rendered["gpu"])[role] == 4
