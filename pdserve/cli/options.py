"""Flags shared by several subcommands, turned into frozen config once."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pdserve.config import CacheConfig, EngineConfig, PreemptionConfig, SchedulerConfig
from pdserve.requests import Priority, SamplingParams

if TYPE_CHECKING:
    from pdserve.worker.runtime import RuntimeConfig


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=None, help="HF model folder or .gguf file (default: embedded SmolLM2-135M)")
    g.add_argument("--device", default="cpu")
    g.add_argument("--dtype", default="float32")
    g.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "flashinfer", "torch-batched"],
                   help="auto: flashinfer on a CUDA device with a half-precision pool, else torch (the reference); "
                        "torch-batched: decode attention read from the KV pool in place (CPU, float32; faster "
                        "at large decode batches)")
    g.add_argument("--kv-blocks", type=int, default=2048, help="device KV blocks")
    g.add_argument("--host-kv-blocks", type=int, default=2048, help="host swap blocks")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--token-budget", type=int, default=None,
                   help="tokens per step, 256-8192 (default: 2048 on a GPU, 512 on a CPU)")
    g.add_argument("--max-chunk-tokens", type=int, default=None,
                   help="one request's share of a step's prefill (default: half the budget)")
    g.add_argument("--policy", default="chunked", choices=["chunked", "fcfs", "decode-first"])
    g.add_argument("--no-prefix-cache", action="store_true")
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    g.add_argument("--recompute-below-tokens", type=int, default=2048,
                   help="a preempted request shorter than this is always recomputed")
    g.add_argument("--swap-above-tokens", type=int, default=16384,
                   help="a preempted request longer than this is swapped to host memory when there is room")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    budget = args.token_budget or (2048 if args.device.startswith("cuda") else 512)
    if not 256 <= budget <= 8192:
        raise SystemExit(f"--token-budget must be within 256-8192, got {budget}")
    chunk = min(args.max_chunk_tokens or budget // 2, budget)
    return EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, attention_backend=args.attention_backend,
        max_model_len=args.max_model_len, calibrate=True,
        cache=CacheConfig(block_size=args.block_size, num_blocks=args.kv_blocks,
                          num_host_blocks=args.host_kv_blocks, prefix_cache=not args.no_prefix_cache),
        scheduler=SchedulerConfig(policy=args.policy, token_budget=budget, max_chunk_tokens=chunk,
                                  preemption=PreemptionConfig(recompute_below_tokens=args.recompute_below_tokens,
                                                              swap_above_tokens=args.swap_above_tokens)),
    )


def runtime_config(args: argparse.Namespace) -> RuntimeConfig:
    """A worker process's engine and torch threads, from the engine flags."""
    from pdserve.worker.runtime import RuntimeConfig  # torch: only for a worker

    return RuntimeConfig(engine_config(args), threads=args.threads)


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[])
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--priority", default="normal", choices=["vip", "normal", "batch"])


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, min_p=args.min_p, seed=args.seed, stop=tuple(args.stop),
                          ignore_eos=args.ignore_eos)


def priority(args: argparse.Namespace) -> Priority:
    return Priority[args.priority.upper()]
