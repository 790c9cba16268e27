"""Frozen configuration, built once from CLI flags and environment, passed down explicitly."""

from __future__ import annotations

from dataclasses import dataclass, field

# The names each engine choice takes (the flags' choices; the modules that act on them check them)
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")  # pdserve/model/dtypes.py
KV_DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")  # the KV pool's elements; auto: the model's dtype
ATTENTION_BACKENDS = ("auto", "torch", "flashinfer", "torch-batched")  # pdserve/attention/selection.py
WEIGHT_PACKINGS = ("onednn", "mkl")  # in the order `auto` prefers them (pdserve/cpu/weight_layout.py)
WEIGHT_LAYOUTS = ("auto", *WEIGHT_PACKINGS, "panels", "dense")
LAYER_KERNELS = ("auto", "native", "torch")  # pdserve/cpu/layer_kernels.py


@dataclass(frozen=True)
class DeadlineConfig:
    """Time limits the router, the workers and the supervisor share (`pdserve up` passes them on)."""

    kv_timeout_s: float = 30.0  # a request's KV between pieces and until CompleteKV; the wire's unset (0) means this
    drain_timeout_s: float = 30.0  # on SIGTERM: how long work in flight may finish
    quarantine_timeout_s: float = 60.0  # decode: longest blocks a withdrawn receive may write stay out of use
    # decode: how long a request whose router's stream broke (no Abort) decodes on for another router
    # to re-attach (pdserve/reattach.py); then it is aborted and its blocks freed. 0: ended at once.
    reattach_grace_s: float = 15.0


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV block
    num_blocks: int = 2048  # device KV blocks (the KV pool)
    num_host_blocks: int = 2048  # host swap pool blocks
    watermark: float = 0.05  # fraction of device blocks kept free for running decodes
    prefix_cache: bool = True  # radix prefix cache, or none
    kv_dtype: str = "auto"  # the pools' elements (KV_DTYPE_NAMES); a half pool below a float32 CPU model: half the bytes


@dataclass(frozen=True)
class PreemptionConfig:
    """Recompute-or-swap by cost. Below/above the two thresholds the choice is fixed (the seed's
    rule); in between the cost model compares recompute time against swap out + in time."""

    recompute_below_tokens: int = 2048
    swap_above_tokens: int = 16384
    prefill_tokens_per_s: float = 5000.0  # measured at start-up where possible
    host_link_bytes_per_s: float = 8e9  # memcpy on CPU, PCIe on GPU


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "chunked"  # fcfs | decode-first | chunked
    token_budget: int = 2048  # tokens per step (decodes + prefill chunks)
    max_chunk_tokens: int = 1024  # one request's share of a step's prefill
    max_running: int = 256  # requests holding device blocks
    max_waiting: int = 4096  # bounded queue; beyond it new requests are refused
    aging_seconds: float | None = 30.0  # a request waiting this long rises one class; None = off
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    chunking: str = "tokens"  # tokens: chunks fill the token budget; time: within step_time_target_s too
    step_time_target_s: float = 0.1  # chunking "time": a step's predicted seconds at most this
    min_chunk_tokens: int = 32  # chunking "time": a step's first prefill chunk at least this (progress)
    # a started stream waiting this long may take the place of one of its class that ran this long
    # (and time_slice_min_tokens tokens) since its admission; None: never (scheduler/slicing.py)
    time_slice_s: float | None = 1.0
    time_slice_min_tokens: int = 4


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # HF folder or .gguf file; None = the embedded SmolLM2
    device: str = "cpu"
    dtype: str = "auto"  # auto: bfloat16 on CUDA (float16 without bf16 support), float32 on CPU
    attention_backend: str = "auto"  # one of ATTENTION_BACKENDS
    weight_layout: str = "auto"  # one of WEIGHT_LAYOUTS
    layer_kernels: str = "auto"  # one of LAYER_KERNELS: norms, SwiGLU, rotary
    tensor_parallel_size: int = 1  # ranks (processes) sharing the model's heads, one device each
    max_model_len: int | None = None  # default: the model's max positions
    seed: int = 0
    calibrate: bool = False  # measure prefill speed and host link at start for the preemption cost model
    deterministic: bool = False  # each output independent of its batch, chunking and workers (see ARCHITECTURE)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
