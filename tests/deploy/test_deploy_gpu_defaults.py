"""What a worker of each shipped configuration runs with: its command line, variables filled in as
Kubernetes or compose would, parsed by the CLI, then resolved by the engine's own dtype and
attention choices. The GPU layouts get bfloat16 and flashinfer; the CPU ones float32 and torch."""

from __future__ import annotations

import re
import tomllib

import pytest
import torch
from deploy_contract import Invocation, k8s_invocations
from deploy_paths import REPO
from k8s_render import Manifest
from test_deploy_flags import compose_invocations

from pdserve.attention.selection import choose_backend
from pdserve.cli import main
from pdserve.cli.options import engine_config
from pdserve.model.dtypes import DeviceFacts, resolve_dtype

EXPECTED = {  # layout -> (device, dtype, attention backend) on a GPU with bfloat16 and flashinfer
    "base": ("cpu", torch.float32, "torch-batched"),
    "cpu-demo": ("cpu", torch.float32, "torch-batched"),
    "gpu": ("cuda", torch.bfloat16, "flashinfer"),
    "compose": ("cuda", torch.bfloat16, "flashinfer"),
}
K8S_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
COMPOSE_VARIABLE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}")


def k8s_workers(manifests: list[Manifest]) -> list[list[str]]:
    """Each worker container's argv with $(VAR) filled from its ConfigMap (other variables,
    the downward API's, become placeholders)."""
    data = {k: v for m in manifests if m["kind"] == "ConfigMap" for k, v in m["data"].items()}
    fill = lambda word: K8S_VARIABLE.sub(lambda m: data.get(m.group(1), "placeholder"), word)  # noqa: E731
    return [[fill(word) for word in argv(call)] for _, call in k8s_invocations(manifests) if call.role != "router"]


def compose_workers() -> list[list[str]]:
    """Each compose worker's argv with ${VAR:-default} at its default (nothing set in the shell)."""
    return [[COMPOSE_VARIABLE.sub(r"\1", word) for word in argv(call)] for call in compose_invocations()
            if call.role != "router"]


def argv(call: Invocation) -> list[str]:
    flags = lambda d: [f"{name}={value}" for name, value in d.items()]  # noqa: E731
    return [*flags(call.global_flags), call.role, *flags(call.flags)]


def workers_of(layout: str, rendered) -> list[list[str]]:
    return compose_workers() if layout == "compose" else k8s_workers(rendered[layout])


@pytest.mark.parametrize("layout", sorted(EXPECTED))
def test_each_worker_runs_with_the_device_dtype_and_backend_of_its_layout(rendered, layout):
    device, dtype, backend = EXPECTED[layout]
    workers = workers_of(layout, rendered)
    assert len(workers) == 2
    for words in workers:
        config = engine_config(main.build_parser().parse_args(words))
        kind = torch.device(config.device).type
        assert kind == device, words
        assert resolve_dtype(config.dtype, DeviceFacts(kind, bf16_supported=True)) == dtype, words
        pool = resolve_dtype(config.dtype, DeviceFacts(kind, bf16_supported=True))
        assert choose_backend(config.attention_backend, kind, None if kind == "cuda" else "not CUDA", pool).name == backend


@pytest.mark.parametrize("layout", ["gpu", "compose"])
def test_gpu_workers_state_the_dtype_and_backend_they_rely_on(rendered, layout):
    """Written out, not left to the flags' defaults: an operator sees and can change them."""
    for words in workers_of(layout, rendered):
        assert {"--dtype=auto", "--attention-backend=auto", "--device=cuda"} <= set(words), words


def test_the_gpu_image_installs_flashinfer_with_the_project():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(re.match(r"flashinfer-python\s*>=", requirement) for requirement in extras["gpu"])
