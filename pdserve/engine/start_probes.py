"""What an engine measures about this machine before it serves, each read from the machine's
cache after the first start (pdserve/measurements.py):

    1. decode attention: the C kernel or the sparse products (pdserve/attention/decode_kernel_probe.py)
    2. how many rows a decode step runs fused (decode_probe.py; under --weight-layout auto)
    3. the recompute-or-swap cost model's prefill speed and host link (calibration.py; workers)

in this order, since each measures the paths the one before chose.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from pdserve.attention.base import AttentionBackend
from pdserve.attention.decode_kernel_probe import DecodeKernelTimings, tune_decode_kernel
from pdserve.config import EngineConfig, PreemptionConfig
from pdserve.engine.calibration import calibrated, serving_identity
from pdserve.engine.decode_probe import DecodeTimings, tune_fused_rows
from pdserve.kv.kv_cache import KVCache
from pdserve.engine.engine_model import EngineModel


@dataclass(frozen=True)
class StartMeasurements:
    decode_kernel: DecodeKernelTimings | None  # None: nothing to choose (not torch-batched with its kernel)
    fused: DecodeTimings | None  # None: no fused step, or a layout other than auto
    preemption: PreemptionConfig  # calibrated where config.calibrate, else as configured


def measure_at_start(config: EngineConfig, loaded: EngineModel, kv: KVCache, host_kv: KVCache,
                     attn: AttentionBackend, dtype: torch.dtype) -> StartMeasurements:
    """Sets the paths chosen on `attn` and `loaded.model`; returns what they were chosen by."""
    model = loaded.model
    identity = serving_identity(loaded.source_path, model, dtype)
    kernel = tune_decode_kernel(attn, kv.shape, loaded.config.num_heads)
    fused = tune_fused_rows(model, kv, attn, identity) if config.weight_layout == "auto" else None
    preemption = config.scheduler.preemption
    if config.calibrate:
        rows = model.fused_decode.max_rows if getattr(model, "fused_decode", None) else 0
        paths = {"fused_rows": rows, "attention_kernel": kernel is None or kernel.native_faster}
        preemption = calibrated(preemption, model, kv, host_kv, attn, {**identity, **paths})
    return StartMeasurements(kernel, fused, preemption)


def with_preemption(config: EngineConfig, measured: StartMeasurements):
    """The scheduler's config with the measured cost model."""
    return dataclasses.replace(config.scheduler, preemption=measured.preemption)
