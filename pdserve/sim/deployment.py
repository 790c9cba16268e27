"""What is simulated: hardware, model, serving knobs, and how the GPUs are split.

    Colocated(gpus=8, tp=8, policy)           one instance (or gpus/tp data-parallel instances)
                                              prefills and decodes, mixed by the policy
    Disaggregated(4, 4, 4, 4)  "4P4D"         prefill instances (TP group each) finish a request
                                              at its first token; its KV moves to a decode instance
    Disaggregated(..., elastic=True)          the same split at the start; the router's planner
                                              (pdserve/elastic) changes instances' roles (sim/elastic.py)

Tensor parallelism must divide the model's KV heads and the role's GPU count.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pdserve.admission import AdmissionPolicy
from pdserve.config import CacheConfig, SchedulerConfig
from pdserve.sim.costmodel import StepCostModel
from pdserve.sim.hardware import HardwareProfile, Link
from pdserve.sim.shapes import ModelShape

GB = 1e9
_SPLIT = re.compile(r"^\s*(\d+)\s*P\s*(\d+)\s*D\s*$", re.IGNORECASE)


RESERVE_AT = ("arrival", "prefill")


@dataclass(frozen=True)
class SimConfig:
    """Serving knobs shared by every instance of a simulated deployment."""

    hardware: HardwareProfile
    shape: ModelShape
    token_budget: int = SchedulerConfig().token_budget
    max_chunk_tokens: int = SchedulerConfig().max_chunk_tokens
    block_size: int = CacheConfig().block_size
    tbt_objective_s: float | None = None  # the decode steps' objective an elastic split's planner keeps
    admission: AdmissionPolicy | None = None  # the router's, judging each request of a split (admitting.py)
    # when a split reserves a prompt's decode blocks: "arrival" (the service: before its prefill
    # is queued) or "prefill" (a what-if: when a prefill instance starts computing it; disagg.py)
    reserve_at: str = "arrival"
    memory_fraction: float = 0.9  # of device memory usable for weights + KV (the engine counts blocks instead)
    host_swap_bytes_per_gpu: float = 64 * GB  # a GPU server's host pool, not the CPU engine's num_host_blocks
    max_model_len: int = 131_072  # Llama-3.1's context; the engine's default is the model's own
    max_running: int = SchedulerConfig().max_running
    aging_seconds: float | None = SchedulerConfig().aging_seconds
    prefix_cache: bool = CacheConfig().prefix_cache
    gpus_per_node: int = 8  # a KV transfer between instances of one node uses NVLink
    # The serving stack's own costs on top of the roofline and the hardware's fixed step overhead:
    # per sequence in a step (batch building, per-sequence attention calls, sampling) and per
    # context token attended (KV gathered and expanded per sequence). 0 for the GPU profiles;
    # fitted for the CPU engine (fit.py).
    chunk_overhead_s: float = 0.0
    context_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if self.reserve_at not in RESERVE_AT:
            raise ValueError(f"reserve_at {self.reserve_at!r}: one of {', '.join(RESERVE_AT)}")


@dataclass(frozen=True)
class Colocated:
    gpus: int
    tp: int
    policy: str = "chunked"

    @property
    def name(self) -> str:
        groups = self.gpus // self.tp
        return f"colocated {self.policy}" + (f" {groups}xTP{self.tp}" if groups > 1 else "")

    @property
    def total_gpus(self) -> int:
        return self.gpus


@dataclass(frozen=True)
class Disaggregated:
    prefill_gpus: int
    prefill_tp: int
    decode_gpus: int
    decode_tp: int
    policy: str = "chunked"
    elastic: bool = False  # instances change role on the planner's word (one TP for both roles)

    @property
    def name(self) -> str:
        return (f"{self.prefill_gpus}P{self.decode_gpus}D{' elastic' if self.elastic else ''} (P "
                f"{self.prefill_gpus // self.prefill_tp}xTP{self.prefill_tp}, D {self.decode_gpus // self.decode_tp}xTP"
                f"{self.decode_tp})")

    @property
    def total_gpus(self) -> int:
        return self.prefill_gpus + self.decode_gpus


Deployment = Colocated | Disaggregated


class InfeasibleDeployment(ValueError):
    """The split cannot run: a TP that does not divide, or weights that do not fit."""


def valid_tps(gpus: int, shape: ModelShape) -> list[int]:
    """TP sizes dividing both `gpus` and the KV heads, smallest first."""
    return [tp for tp in range(1, gpus + 1) if gpus % tp == 0 and shape.num_kv_heads % tp == 0]


def fits(cfg: SimConfig, tp: int) -> bool:
    """The weight shard leaves device memory for at least one KV block."""
    free = cfg.hardware.mem_bytes * cfg.memory_fraction - cfg.shape.weight_bytes() / tp
    return free > cfg.block_size * cfg.shape.kv_bytes_per_token() / tp


def _fitting_tps(gpus: int, cfg: SimConfig) -> list[int]:
    """Valid TP sizes of `gpus` whose weight shard fits, smallest first (InfeasibleDeployment: none)."""
    options = [tp for tp in valid_tps(gpus, cfg.shape) if fits(cfg, tp)]
    if not options:
        raise InfeasibleDeployment(f"{cfg.shape.name} fits no TP group of {gpus} x {cfg.hardware.name}")
    return options


def default_tp(gpus: int, cfg: SimConfig) -> int:
    """The largest valid TP: fewest, biggest instances (most KV room per instance)."""
    return _fitting_tps(gpus, cfg)[-1]


def smallest_tp(gpus: int, cfg: SimConfig) -> int:
    """The smallest valid TP: the most instances (an elastic split's, for the most to move)."""
    return _fitting_tps(gpus, cfg)[0]


def check(deployment: Deployment, cfg: SimConfig) -> None:
    """Raise InfeasibleDeployment unless every role's TP divides its GPUs and KV heads and fits."""
    roles = ([(deployment.gpus, deployment.tp)] if isinstance(deployment, Colocated)
             else [(deployment.prefill_gpus, deployment.prefill_tp), (deployment.decode_gpus, deployment.decode_tp)])
    for gpus, tp in roles:
        if gpus < 1 or tp not in valid_tps(gpus, cfg.shape):
            raise InfeasibleDeployment(f"TP {tp} must divide {gpus} GPUs and {cfg.shape.num_kv_heads} KV heads")
        if not fits(cfg, tp):
            raise InfeasibleDeployment(f"{cfg.shape.name} weights do not fit on TP {tp} x {cfg.hardware.name}")
    if isinstance(deployment, Disaggregated) and deployment.elastic:
        if deployment.prefill_tp != deployment.decode_tp:
            raise InfeasibleDeployment("an elastic split keeps each instance's TP in both roles: prefill and decode "
                                       f"TP must be equal, got {deployment.prefill_tp} and {deployment.decode_tp}")
        if deployment.prefill_gpus // deployment.prefill_tp + deployment.decode_gpus // deployment.decode_tp < 3:
            raise InfeasibleDeployment("an elastic split needs at least three instances (neither role is ever left "
                                       "without one)")


def parse_split(text: str, cfg: SimConfig, prefill_tp: int | None = None, decode_tp: int | None = None,
                policy: str = "chunked", elastic: bool = False) -> Disaggregated:
    """"4P4D" -> 4 prefill GPUs and 4 decode GPUs; TPs default to the largest that fits (elastic:
    one TP for both roles, the smallest that fits, for the most instances to move)."""
    match = _SPLIT.match(text)
    if match is None:
        raise ValueError(f"split {text!r} is not of the form xPyD (e.g. 4P4D)")
    p, d = int(match.group(1)), int(match.group(2))
    if elastic and not (prefill_tp or decode_tp):
        prefill_tp = decode_tp = smallest_tp(math.gcd(p, d), cfg)
    split = Disaggregated(p, prefill_tp or default_tp(p, cfg), d, decode_tp or default_tp(d, cfg), policy, elastic)
    check(split, cfg)
    return split


def kv_link(deployment: Deployment, cfg: SimConfig) -> Link:
    """NVLink while the whole deployment sits in one node, the network otherwise."""
    return Link.INTERCONNECT if deployment.total_gpus <= cfg.gpus_per_node else Link.NETWORK


def cost_model(cfg: SimConfig, tp: int) -> StepCostModel:
    return StepCostModel(cfg.hardware, cfg.shape, tp)
