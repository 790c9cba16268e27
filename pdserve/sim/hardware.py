"""Accelerator profiles: the few numbers a roofline step model needs.

Every rate is per device (one GPU, or this whole CPU machine): a tensor-parallel group of `tp`
devices has `tp` times the FLOPs, HBM bandwidth, host links and NICs. Peak figures are the
datasheet's dense (no sparsity) numbers for the serving dtype; the efficiencies say how much of
them a well-tuned kernel reaches. Profiles are frozen: calibrate with `profile.calibrated(...)`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

GB = 1e9
TB = 1e12


class Link(enum.Enum):
    """Which wire a copy crosses."""

    HOST = "host"  # device <-> host memory (PCIe): swap out / swap in
    INTERCONNECT = "interconnect"  # device <-> device in one node (NVLink): TP, local KV moves
    NETWORK = "network"  # node <-> node (RDMA NIC): KV transfer between P and D workers


@dataclass(frozen=True)
class HardwareProfile:
    """One device's peak rates, capacity and reachable fractions.

    `peak_flops` dense FLOP/s for the dtype; `*_bytes_s` one direction, bytes/s;
    `collective_latency_s` fixed cost of one all-reduce; `step_overhead_s` fixed cost of one
    forward step (launch, scheduling, sampling) that no batch size amortises away.
    """

    name: str
    peak_flops: float
    mem_bandwidth_bytes_s: float
    mem_bytes: float
    host_link_bytes_s: float
    interconnect_bytes_s: float
    network_bytes_s: float
    compute_efficiency: float = 0.7
    bandwidth_efficiency: float = 0.85
    step_overhead_s: float = 0.0
    collective_latency_s: float = 0.0

    def __post_init__(self) -> None:
        rates = (self.peak_flops, self.mem_bandwidth_bytes_s, self.mem_bytes, self.host_link_bytes_s,
                 self.interconnect_bytes_s, self.network_bytes_s)
        if min(rates) <= 0:
            raise ValueError(f"{self.name}: rates and capacity must be positive")
        for eff in (self.compute_efficiency, self.bandwidth_efficiency):
            if not 0 < eff <= 1:
                raise ValueError(f"{self.name}: efficiencies must lie in (0, 1], got {eff}")
        if self.step_overhead_s < 0 or self.collective_latency_s < 0:
            raise ValueError(f"{self.name}: overheads must be >= 0")

    @property
    def achievable_flops(self) -> float:
        return self.peak_flops * self.compute_efficiency

    @property
    def achievable_bandwidth(self) -> float:
        return self.mem_bandwidth_bytes_s * self.bandwidth_efficiency

    def link_bytes_s(self, link: Link) -> float:
        return {
            Link.HOST: self.host_link_bytes_s,
            Link.INTERCONNECT: self.interconnect_bytes_s,
            Link.NETWORK: self.network_bytes_s,
        }[link]

    def calibrated(self, **measured: float) -> HardwareProfile:
        """A copy with measured fields replaced (e.g. `peak_flops=`, `host_link_bytes_s=`)."""
        return replace(self, **measured)


def h100_sxm() -> HardwareProfile:
    """H100 SXM5 80 GB: BF16 dense 989 TFLOP/s, HBM3 3.35 TB/s.

    Links are per direction, as a ring all-reduce or a one-way copy uses them: NVLink4's
    900 GB/s is both directions (450 each); PCIe 5.0 x16 is 64 GB/s each way (the seed's
    "128 GB/s" counts both); one 400 Gb/s NIC per GPU gives 50 GB/s between nodes.
    """
    return HardwareProfile(
        name="h100-sxm", peak_flops=989 * TB, mem_bandwidth_bytes_s=3.35 * TB, mem_bytes=80 * GB,
        host_link_bytes_s=64 * GB, interconnect_bytes_s=450 * GB, network_bytes_s=50 * GB,
        step_overhead_s=5e-4, collective_latency_s=5e-6,
    )


def h200() -> HardwareProfile:
    """H200 SXM 141 GB: H100's compute with HBM3e at 4.8 TB/s."""
    return replace(h100_sxm(), name="h200", mem_bandwidth_bytes_s=4.8 * TB, mem_bytes=141 * GB)


def a100_80gb() -> HardwareProfile:
    """A100 SXM 80 GB: BF16 dense 312 TFLOP/s, HBM2e 2.039 TB/s.

    Per direction: NVLink3 300 GB/s (600 both ways), PCIe 4.0 x16 32 GB/s, 200 Gb/s NIC.
    """
    return HardwareProfile(
        name="a100-80gb", peak_flops=312 * TB, mem_bandwidth_bytes_s=2.039 * TB, mem_bytes=80 * GB,
        host_link_bytes_s=32 * GB, interconnect_bytes_s=300 * GB, network_bytes_s=25 * GB,
        step_overhead_s=5e-4, collective_latency_s=8e-6,
    )


def cpu_local() -> HardwareProfile:
    """This 2-core machine computing in fp32: defaults to overwrite with measured figures.

    The rates are already achieved ones (fp32 matmul ~100 GFLOP/s on 2 threads, memcpy
    ~8 GB/s), so both efficiencies are 1. Host, "interconnect" and "network" are all memcpy.
    """
    return HardwareProfile(
        name="cpu-local", peak_flops=100e9, mem_bandwidth_bytes_s=8 * GB, mem_bytes=16 * GB,
        host_link_bytes_s=8 * GB, interconnect_bytes_s=8 * GB, network_bytes_s=5 * GB,
        compute_efficiency=1.0, bandwidth_efficiency=1.0, step_overhead_s=2e-3,
    )


def hardware_profiles() -> dict[str, HardwareProfile]:
    """Every built-in profile by name (a fresh dict each call)."""
    return {p.name: p for p in (h100_sxm(), h200(), a100_80gb(), cpu_local())}


def get_hardware(name: str) -> HardwareProfile:
    profiles = hardware_profiles()
    if name not in profiles:
        raise KeyError(f"unknown hardware {name!r}; known: {sorted(profiles)}")
    return profiles[name]
