"""Physical lower bounds: no simulated or measured time may beat these.

They assume 100% of peak FLOPs or 100% of memory bandwidth on every one of `gpus` devices,
free communication and no overhead, so any honest step model lies at or above them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pdserve.sim.hardware import HardwareProfile
from pdserve.sim.shapes import ModelShape


def prefill_flops(shape: ModelShape, tokens: int) -> float:
    """A whole prompt at once: linear layers for every token, causal attention, one lm_head row."""
    return shape.linear_flops(tokens, sampled=1) + shape.attention_flops(tokens, tokens)


def min_prefill_time(shape: ModelShape, hw: HardwareProfile, tokens: int, gpus: int) -> float:
    return prefill_flops(shape, tokens) / (hw.peak_flops * gpus)


def min_total_prefill_time(shape: ModelShape, hw: HardwareProfile, prompts: Iterable[int], gpus: int) -> float:
    """Prefilling every prompt of a workload, however the work is split or scheduled."""
    return sum(prefill_flops(shape, t) for t in prompts) / (hw.peak_flops * gpus)


def min_decode_step_time(shape: ModelShape, hw: HardwareProfile, batch_contexts: Sequence[int], gpus: int) -> float:
    """One decode step must stream the weights and every sequence's KV (contexts after the step)."""
    nbytes = shape.streamed_weight_bytes() + sum(batch_contexts) * shape.kv_bytes_per_token()
    return nbytes / (hw.mem_bandwidth_bytes_s * gpus)


def min_step_time(shape: ModelShape, hw: HardwareProfile, chunks: Iterable[tuple[int, int]], gpus: int) -> float:
    """Any step of `(query_tokens, context_len_after)` chunks: the larger of its two rooflines.

    A step with no chunks runs no forward pass and is bounded by 0.
    """
    flops = bytes_kv = 0.0
    count = 0
    for q, c in chunks:
        flops += q * shape.linear_flops_per_token() + shape.attention_flops(q, c)
        bytes_kv += c * shape.kv_bytes_per_token()
        count += 1
    if count == 0:
        return 0.0
    compute = flops / (hw.peak_flops * gpus)
    memory = (shape.streamed_weight_bytes() + bytes_kv) / (hw.mem_bandwidth_bytes_s * gpus)
    return max(compute, memory)

