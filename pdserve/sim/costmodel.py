"""Roofline price of one engine step on a tensor-parallel group. Tensor-free, closed-form.

A step is a batch of chunks, each `(query_tokens, context_len)` with `context_len` the
sequence length after the chunk (a decode is `(1, c)`). With Q = sum q, A = sum of attended
positions (see `shapes.attended_positions`), C = sum c, n = number of chunks, tp devices:

    flops     = Q * linear_flops_per_token + n * lm_head_flops + A * attention_flops_per_position
    bytes     = streamed_weight_bytes + C * kv_bytes_per_token          (the whole group)
    compute_s = flops / (tp * peak_flops * compute_efficiency)
    memory_s  = bytes / (tp * mem_bandwidth * bandwidth_efficiency)
    comm_s    = 2 * layers * (collective_latency + 2 (tp-1)/tp * Q * hidden * act_bytes / interconnect)
    swap_s    = (swap_out_bytes + swap_in_bytes) / (tp * host_link)
    total_s   = max(compute_s, memory_s) + comm_s + swap_s + step_overhead

Every chunk is charged one lm_head row (one sampled token); comm_s is 0 at tp = 1; swaps run
before the forward pass, as `SchedulerOutput` orders them; a step with no chunks costs only
its swaps. Byte counts passed in are totals over the group: each device moves its shard.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pdserve.sim.hardware import HardwareProfile, Link
from pdserve.sim.shapes import ModelShape, attended_positions


@dataclass(frozen=True, slots=True)
class StepLoad:
    """The sums of a step's chunks that fix its cost; add loads to merge batches."""

    chunks: int = 0
    query_tokens: int = 0
    attended: int = 0
    context_tokens: int = 0

    @classmethod
    def of(cls, chunks: Iterable[tuple[int, int]]) -> StepLoad:
        n = q_sum = a_sum = c_sum = 0
        for q, c in chunks:
            n += 1
            q_sum += q
            a_sum += attended_positions(q, c)
            c_sum += c
        return cls(n, q_sum, a_sum, c_sum)

    @classmethod
    def decodes(cls, count: int, context_sum: int) -> StepLoad:
        """`count` decodes whose context lengths (after the step) sum to `context_sum`."""
        return cls(count, count, context_sum, context_sum)

    def __add__(self, other: StepLoad) -> StepLoad:
        return StepLoad(self.chunks + other.chunks, self.query_tokens + other.query_tokens,
                        self.attended + other.attended, self.context_tokens + other.context_tokens)


@dataclass(frozen=True, slots=True)
class StepCost:
    compute_s: float
    memory_s: float
    comm_s: float
    swap_s: float
    overhead_s: float
    total_s: float
    flops: float
    bytes_read: float

    @property
    def compute_bound(self) -> bool:
        return self.compute_s >= self.memory_s


class StepCostModel:
    """Prices steps of `shape` served on `tp` devices of `hardware`. Immutable after init."""

    __slots__ = ("hardware", "shape", "tp", "_flop_s", "_byte_s", "_comm_per_token_s", "_comm_fixed_s")

    def __init__(self, hardware: HardwareProfile, shape: ModelShape, tp: int = 1):
        if tp < 1 or shape.num_kv_heads % tp:
            raise ValueError(f"tp={tp} must be >= 1 and divide {shape.name}'s {shape.num_kv_heads} KV heads")
        self.hardware, self.shape, self.tp = hardware, shape, tp
        self._flop_s = tp * hardware.achievable_flops
        self._byte_s = tp * hardware.achievable_bandwidth
        all_reduces = 2 * shape.num_layers if tp > 1 else 0
        ring = 2 * (tp - 1) / tp * shape.hidden * shape.bytes_per_activation / hardware.interconnect_bytes_s
        self._comm_per_token_s = all_reduces * ring
        self._comm_fixed_s = all_reduces * hardware.collective_latency_s

    def step_time(self, chunks: Iterable[tuple[int, int]], swap_out_bytes: float = 0.0,
                  swap_in_bytes: float = 0.0) -> StepCost:
        """Price one step of `(query_tokens, context_len_after)` chunks plus its swaps."""
        return self.load_time(StepLoad.of(chunks), swap_out_bytes, swap_in_bytes)

    def load_time(self, load: StepLoad, swap_out_bytes: float = 0.0, swap_in_bytes: float = 0.0) -> StepCost:
        """`step_time` from pre-summed chunks (the fast path for a simulator)."""
        swap_s = self.transfer_time(swap_out_bytes + swap_in_bytes, Link.HOST)
        if load.chunks == 0:
            return StepCost(0.0, 0.0, 0.0, swap_s, 0.0, swap_s, 0.0, 0.0)
        flops, nbytes = self.flops(load), self.bytes_read(load)
        compute_s, memory_s = flops / self._flop_s, nbytes / self._byte_s
        comm_s = self._comm_fixed_s + load.query_tokens * self._comm_per_token_s
        overhead_s = self.hardware.step_overhead_s
        total_s = max(compute_s, memory_s) + comm_s + swap_s + overhead_s
        return StepCost(compute_s, memory_s, comm_s, swap_s, overhead_s, total_s, flops, nbytes)

    def flops(self, load: StepLoad) -> float:
        s = self.shape
        return (load.query_tokens * s.linear_flops_per_token() + load.chunks * s.lm_head_flops()
                + load.attended * s.attention_flops_per_position())

    def bytes_read(self, load: StepLoad) -> float:
        return self.shape.streamed_weight_bytes() + load.context_tokens * self.shape.kv_bytes_per_token()

    def transfer_time(self, num_bytes: float, link: Link) -> float:
        """`num_bytes` (group total) split evenly over the tp devices' own links of this kind."""
        if num_bytes < 0:
            raise ValueError(f"negative transfer size {num_bytes}")
        return num_bytes / (self.tp * self.hardware.link_bytes_s(link))

    def swap_time(self, num_bytes: float) -> float:
        return self.transfer_time(num_bytes, Link.HOST)

    def kv_transfer_time(self, tokens: int, link: Link = Link.NETWORK) -> float:
        """Moving the KV of `tokens` tokens to another worker (disaggregated prefill -> decode)."""
        return self.transfer_time(tokens * self.shape.kv_bytes_per_token(), link)

    def free_bytes_per_device(self, memory_fraction: float = 1.0) -> float:
        """Device memory left for KV once this device's weight shard is resident."""
        free = self.hardware.mem_bytes * memory_fraction - self.shape.weight_bytes() / self.tp
        if free <= 0:
            raise ValueError(f"{self.shape.name} does not fit on {self.tp} x {self.hardware.name}")
        return free

    def kv_capacity_tokens(self, memory_fraction: float = 1.0) -> int:
        """Tokens of KV the whole group holds (each device holds 1/tp of every token)."""
        per_device_token = self.shape.kv_bytes_per_token() / self.tp
        return int(self.free_bytes_per_device(memory_fraction) // per_device_token)
