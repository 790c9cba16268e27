"""The tensor-parallel sizes every shipped layout deploys agree with `pdserve simulate`: for the
model a layout serves and the devices a worker's pod (or compose service) holds, its size is the
one the simulator's sizing rule recommends (pdserve/sim/deployment.py `default_tp`: the largest
that divides the devices and the KV heads and fits), one device per rank, and a size the worker
itself accepts for that model.

A layout that serves a checkpoint from a volume names it in its ConfigMap: PDSERVE_MODEL (the
--model path), PDSERVE_MODEL_PRESET and PDSERVE_GPU_PRESET (the simulator's shape and GPU its
sizes are for). The others serve the embedded model."""

from __future__ import annotations

import re
from typing import NamedTuple

import pytest
import yaml
from deploy_paths import DOCKER
from k8s_render import Manifest, pod_templates
from test_deploy_gpu_defaults import workers_of

from pdserve.cli import main
from pdserve.cli.options import engine_config
from pdserve.config import EngineConfig
from pdserve.checkpoint.hf_config import config_from_hf
from pdserve.checkpoint.model_config import ModelConfig
from pdserve.model.dtypes import DeviceFacts, resolve_dtype
from pdserve.checkpoint.source import read_model_config
from pdserve.parallel.shard import check_tensor_parallel
from pdserve.sim.deployment import SimConfig, default_tp, valid_tps
from pdserve.sim.hardware import HardwareProfile, get_hardware
from pdserve.sim.shapes import ModelShape, get_shape

EMBEDDED_SHAPE = "smollm2-135m"  # the simulator's shape of the embedded model (no --model)
HARDWARE = {"cuda": "h100-sxm", "cpu": "cpu-local"}  # for layouts serving the embedded model
GPU = "nvidia.com/gpu"
COMPOSE_DEFAULT = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}")
LAYOUTS = ["base", "cpu-demo", "compose", "gpu"]


class SizedFor(NamedTuple):
    """What a layout's sizes follow: the --model it passes (None: embedded), its simulator shape,
    and the simulator hardware of its device kind."""

    model: str | None
    shape: ModelShape
    hardware: dict[str, HardwareProfile]


def config_map(manifests: list[Manifest]) -> dict[str, str]:
    return {k: v for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "pdserve-config"
            for k, v in m["data"].items()}


def sized_for(rendered, layout: str) -> SizedFor:
    data = {} if layout == "compose" else config_map(rendered[layout])
    if "PDSERVE_MODEL_PRESET" not in data:
        return SizedFor(None, get_shape(EMBEDDED_SHAPE), {k: get_hardware(v) for k, v in HARDWARE.items()})
    return SizedFor(data["PDSERVE_MODEL"], get_shape(data["PDSERVE_MODEL_PRESET"]),
                    {"cuda": get_hardware(data["PDSERVE_GPU_PRESET"])})


def preset_config(shape: ModelShape) -> ModelConfig:
    """The ModelConfig a checkpoint of the simulator's shape reads as (its config.json's sizes)."""
    raw = {"architectures": ["LlamaForCausalLM"], "vocab_size": shape.vocab, "hidden_size": shape.hidden,
           "intermediate_size": shape.intermediate, "num_hidden_layers": shape.num_layers,
           "num_attention_heads": shape.num_heads, "num_key_value_heads": shape.num_kv_heads,
           "head_dim": shape.head_dim, "tie_word_embeddings": shape.tied_embeddings}
    return config_from_hf(raw, shape.name)


def served_config(sized: SizedFor) -> ModelConfig:
    return read_model_config(None) if sized.model is None else preset_config(sized.shape)


def k8s_devices(rendered, layout: str) -> dict[str, int]:
    """Role -> GPUs each worker pod requests (0 for a CPU pod)."""
    return {container["name"]: int(container.get("resources", {}).get("requests", {}).get(GPU, 0))
            for _, spec in pod_templates(rendered[layout]) for container in spec["containers"]
            if container["name"] in ("prefill", "decode")}


def compose_devices() -> dict[str, int]:
    """Role -> GPU ids reserved for the service at the variables' defaults."""
    services = yaml.safe_load((DOCKER / "docker-compose.yaml").read_text())["services"]
    return {role: sum(len(COMPOSE_DEFAULT.sub(r"\1", i).split(","))
                      for device in services[role]["deploy"]["resources"]["reservations"]["devices"]
                      for i in device["device_ids"]) for role in ("prefill", "decode")}


def workers(rendered, layout: str) -> dict[str, tuple[EngineConfig, int]]:
    """Role -> (its EngineConfig as the CLI parses its command line, the devices its pod holds)."""
    devices = compose_devices() if layout == "compose" else k8s_devices(rendered, layout)
    configs = {}
    for words in workers_of(layout, rendered):
        role = next(w for w in words if not w.startswith("-"))
        configs[role] = (engine_config(main.build_parser().parse_args(words)), devices[role])
    return configs


def test_the_simulator_s_shape_is_the_embedded_model():
    served, shape = read_model_config(None), get_shape(EMBEDDED_SHAPE)
    assert (served.num_kv_heads, served.num_heads, served.num_layers) == (
        shape.num_kv_heads, shape.num_heads, shape.num_layers)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_worker_runs_at_the_size_the_simulator_recommends_for_its_devices(rendered, layout):
    sized = sized_for(rendered, layout)
    for role, (config, gpus) in workers(rendered, layout).items():
        assert config.model == sized.model, f"{layout} {role}: --model is not the layout's declared model"
        kind = config.device.split(":")[0]
        devices, tp = (gpus if kind == "cuda" else 1), config.tensor_parallel_size
        assert devices == tp, f"{layout} {role}: one device per rank ({devices} for size {tp})"
        assert tp in valid_tps(devices, sized.shape), f"{layout} {role}: size {tp} breaks the sizing rule"
        assert tp == default_tp(devices, SimConfig(sized.hardware[kind], sized.shape)), f"{layout} {role}"
        check_tensor_parallel(served_config(sized), tp)


def test_the_gpu_overlay_serves_the_preset_s_model_from_its_read_only_volume(rendered):
    sized = sized_for(rendered, "gpu")
    assert sized.model is not None and sized.shape.num_kv_heads % 4 == 0
    for workload, spec in pod_templates(rendered["gpu"]):
        for container in spec["containers"]:
            if container["name"] in ("router", "prefill", "decode"):
                volumes = {v["name"]: v for v in spec["volumes"]}
                mount = next(m for m in container["volumeMounts"] if sized.model.startswith(m["mountPath"] + "/"))
                claim = volumes[mount["name"]]["persistentVolumeClaim"]
                assert mount["readOnly"] is True and claim["readOnly"] is True, workload["metadata"]["name"]
                assert f"--model={sized.model}" in _filled_args(rendered["gpu"], container)


def _filled_args(manifests: list[Manifest], container: Manifest) -> list[str]:
    data = config_map(manifests)
    return [re.sub(r"\$\(([A-Z_]+)\)", lambda m: data.get(m.group(1), m.group(0)), a) for a in container["args"]]


def test_the_gpu_overlay_s_weights_and_kv_pools_fit_each_rank_s_gpu(rendered):
    """bf16 weights (the preset's bytes per parameter) and the KV pool, per rank, within the
    simulator's usable share of the preset GPU's memory."""
    sized, gpu = sized_for(rendered, "gpu"), sized_for(rendered, "gpu").hardware["cuda"]
    usable = gpu.mem_bytes * SimConfig(gpu, sized.shape).memory_fraction
    for role, (config, _) in workers(rendered, "gpu").items():
        dtype = resolve_dtype(config.dtype, DeviceFacts("cuda", bf16_supported=True))
        assert dtype.itemsize == sized.shape.bytes_per_param == sized.shape.bytes_per_kv_elem, role
        tp, pool = config.tensor_parallel_size, config.cache.num_blocks
        per_rank = (sized.shape.weight_bytes() + pool * sized.shape.kv_block_bytes(config.cache.block_size)) / tp
        assert per_rank < usable, f"{role}: {per_rank / 1e9:.1f} GB per rank, {usable / 1e9:.1f} GB usable"


def test_compose_states_the_decode_size_and_defaults_to_one():
    services = yaml.safe_load((DOCKER / "docker-compose.yaml").read_text())["services"]
    assert "--tensor-parallel-size=${PDSERVE_DECODE_TENSOR_PARALLEL_SIZE:-1}" in services["decode"]["command"]
