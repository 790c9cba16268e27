"""What an engine measures about this machine before it serves, each read from the machine's
cache after the first start (pdserve/measurements.py):

    1. decode attention: the C kernel or the sparse products (pdserve/attention/decode_kernel_probe.py)
    2. how many rows a decode step runs fused (decode_probe.py; under --weight-layout auto)
    3. the recompute-or-swap cost model's prefill speed and host link (calibration.py; workers)
    4. a step's cost in seconds from its decode rows, prompt tokens and attention's context
       (step_cost_probe.py; only where chunks are sized by time)

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
from pdserve.engine.step_cost_probe import step_cost_at_start
from pdserve.kv.kv_cache import KVCache
from pdserve.engine.engine_model import EngineModel
from pdserve.scheduler.step_cost import StepCoefficients
from pdserve.start_phases import StartPhases


@dataclass(frozen=True)
class StartMeasurements:
    decode_kernel: DecodeKernelTimings | None  # None: nothing to choose (not torch-batched with its kernel)
    fused: DecodeTimings | None  # None: no fused step, or a layout other than auto
    preemption: PreemptionConfig  # calibrated where config.calibrate, else as configured
    step_cost: StepCoefficients | None = None  # None: chunks sized by tokens


def measure_at_start(config: EngineConfig, loaded: EngineModel, kv: KVCache, host_kv: KVCache,
                     attn: AttentionBackend, dtype: torch.dtype, phases: StartPhases) -> StartMeasurements:
    """Sets the paths chosen on `attn` and `loaded.model`; returns what they were chosen by, each
    probe a phase of `phases`."""
    model = loaded.model
    identity = serving_identity(loaded.source_path, model, dtype)
    kernel = tune_decode_kernel(attn, kv.shape, loaded.config.num_heads, kv.data.dtype)
    phases.done("attention probe")
    fused = tune_fused_rows(model, kv, attn, identity) if config.weight_layout == "auto" else None
    phases.done("fused-rows probe")
    preemption = config.scheduler.preemption
    rows = model.fused_decode.max_rows if getattr(model, "fused_decode", None) else 0
    paths = {**identity, "fused_rows": rows, "attention_kernel": kernel is None or kernel.native_faster}
    if config.calibrate:
        preemption = calibrated(preemption, model, kv, host_kv, attn, paths)
    phases.done("calibration")
    step_cost = step_cost_at_start(model, kv, attn, paths) if config.scheduler.chunking == "time" else None
    phases.done("step-cost probe")
    return StartMeasurements(kernel, fused, preemption, step_cost)


def with_preemption(config: EngineConfig, measured: StartMeasurements):
    """The scheduler's config with the measured cost model."""
    return dataclasses.replace(config.scheduler, preemption=measured.preemption)
