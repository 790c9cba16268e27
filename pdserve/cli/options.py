"""Flags shared by several subcommands, turned into frozen config once."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pdserve.config import (
    ATTENTION_BACKENDS,
    DTYPE_NAMES,
    KV_DTYPE_NAMES,
    LAYER_KERNELS,
    WEIGHT_LAYOUTS,
    CacheConfig,
    EngineConfig,
    PreemptionConfig,
    SchedulerConfig,
)
from pdserve.requests import Constraint, ConstraintKind, Priority, SamplingParams

if TYPE_CHECKING:
    from pdserve.worker.runtime import RuntimeConfig


CPU_TOKEN_BUDGET = 512  # --token-budget's default without a GPU (with one: SchedulerConfig's)


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """Defaults from EngineConfig and the configs inside it."""
    e, cache, sched, pre = EngineConfig(), CacheConfig(), SchedulerConfig(), PreemptionConfig()
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=e.model, help="HF model folder or .gguf file (default: embedded SmolLM2-135M)")
    g.add_argument("--device", default=e.device)
    g.add_argument("--dtype", default=e.dtype, choices=DTYPE_NAMES,
                   help="weights and KV pool; auto: bfloat16 on CUDA (float16 where the GPU lacks bfloat16), "
                        "float32 on CPU")
    g.add_argument("--attention-backend", default=e.attention_backend,
                   choices=ATTENTION_BACKENDS,
                   help="auto: flashinfer on a CUDA device with a half-precision pool, torch-batched on a CPU "
                        "with float32 (decode attention read from the KV pool in place by a C kernel built at "
                        "first use), else torch (the reference)")
    g.add_argument("--weight-layout", default=e.weight_layout, choices=WEIGHT_LAYOUTS,
                   help="auto: on a CPU with float32 weights, for each range of rows the layout this machine "
                        "measured fastest for the model's projections (dense, oneDNN's or MKL's packing, or "
                        "panels by a C kernel built at first use), and decode steps fused in one C call up to "
                        "the batch where that measured faster; measured once, kept beside the kernels "
                        "(`pdserve info` prints them); each copy takes the weights' memory again; panels: "
                        "products of up to 256 rows from the panels; dense: no copy")
    g.add_argument("--layer-kernels", default=e.layer_kernels, choices=LAYER_KERNELS,
                   help="the norms, SwiGLU's product and rotary positions; auto: on a CPU with float32 weights "
                        "one C pass over each row (built at first use), else torch (the reference)")
    g.add_argument("--deterministic", action="store_true", default=e.deterministic,
                   help="every request's output bitwise the same whatever else runs beside it, however its "
                        "prompt is chunked, wherever it is prefilled, preempted, resumed or moved (greedy and "
                        "seeded sampling): each row computed alone (projections in panels or fixed tiles, "
                        "attention a row at a time); overrides --weight-layout and --attention-backend; slower "
                        "(docs/BENCHMARKS.md)")
    g.add_argument("--tensor-parallel-size", type=int, default=e.tensor_parallel_size,
                   help="ranks (one process and one device each) splitting the model's heads; must divide "
                        "its KV heads")
    g.add_argument("--kv-blocks", type=int, default=cache.num_blocks, help="device KV blocks")
    g.add_argument("--host-kv-blocks", type=int, default=cache.num_host_blocks, help="host swap blocks")
    g.add_argument("--block-size", type=int, default=cache.block_size)
    g.add_argument("--kv-cache-dtype", default=cache.kv_dtype, choices=KV_DTYPE_NAMES,
                   help="the KV pools' elements; auto: the model's dtype; bfloat16 or float16 below a float32 "
                        "model on a CPU: half the memory (twice the blocks for the same bytes), half the bytes "
                        "moved and read by each decode step, keys and values rounded to nearest as stored "
                        "(outputs may differ from a float32 cache's); every worker of a fleet holds the same")
    g.add_argument("--token-budget", type=int, default=None,
                   help=f"tokens per step, 256-8192 (default: {sched.token_budget} on a GPU, "
                        f"{CPU_TOKEN_BUDGET} on a CPU)")
    g.add_argument("--max-chunk-tokens", type=int, default=None,
                   help="one request's share of a step's prefill (default: half the budget)")
    g.add_argument("--chunking", default=sched.chunking, choices=["tokens", "time"],
                   help="how a step's prefill chunks are sized: tokens (to the token budget) or time (the largest "
                        "chunks whose step this machine's cost model, measured at start and refined from the "
                        "steps it runs, predicts within --step-time-target-ms; the token caps still cap)")
    g.add_argument("--step-time-target-ms", type=float, default=sched.step_time_target_s * 1e3,
                   help="with --chunking time: a step's predicted time at most this (a waiting prompt enters "
                        "within about one such step; a decode's time between tokens is about it)")
    g.add_argument("--min-chunk-tokens", type=int, default=sched.min_chunk_tokens,
                   help="with --chunking time: the step's first prefill chunk at least this, over the target "
                        "if need be (progress)")
    g.add_argument("--time-slice-s", type=float, default=sched.time_slice_s or 0.0,
                   help="a stream already started (resumed after a fault or preempted here) that has waited this "
                        "long may take the place of a running request of its own class that has run this long "
                        f"and streamed {sched.time_slice_min_tokens} tokens since its admission, the longest "
                        "running first (swapped out when the host pool holds it); 0: never, a started stream "
                        "waits for room")
    g.add_argument("--max-num-seqs", type=int, default=sched.max_running,
                   help="requests a worker runs at once (holding device blocks); more wait in its queue")
    g.add_argument("--policy", default=sched.policy, choices=["chunked", "fcfs", "decode-first"])
    g.add_argument("--no-prefix-cache", action="store_true")
    g.add_argument("--max-model-len", type=int, default=e.max_model_len)
    g.add_argument("--threads", type=int, default=None, help="torch threads of each rank (default: all cores)")
    g.add_argument("--recompute-below-tokens", type=int, default=pre.recompute_below_tokens,
                   help="a preempted request shorter than this is always recomputed (a time slice's victim, "
                        "back soon, is swapped whenever that is quicker)")
    g.add_argument("--swap-above-tokens", type=int, default=pre.swap_above_tokens,
                   help="a preempted request longer than this is swapped to host memory when there is room")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    gpu = args.device.startswith("cuda")
    budget = args.token_budget or (SchedulerConfig().token_budget if gpu else CPU_TOKEN_BUDGET)
    if not 256 <= budget <= 8192:
        raise SystemExit(f"--token-budget must be within 256-8192, got {budget}")
    chunk = min(args.max_chunk_tokens or budget // 2, budget)
    if args.max_num_seqs < 1:
        raise SystemExit(f"--max-num-seqs must be at least 1, got {args.max_num_seqs}")
    if args.step_time_target_ms <= 0 or args.min_chunk_tokens < 1:
        raise SystemExit("--step-time-target-ms must be > 0 and --min-chunk-tokens at least 1")
    if args.time_slice_s < 0:
        raise SystemExit(f"--time-slice-s must be >= 0 (0: off), got {args.time_slice_s}")
    return EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, attention_backend=args.attention_backend,
        weight_layout=args.weight_layout, layer_kernels=args.layer_kernels,
        tensor_parallel_size=args.tensor_parallel_size,
        max_model_len=args.max_model_len, calibrate=True, deterministic=args.deterministic,
        cache=CacheConfig(block_size=args.block_size, num_blocks=args.kv_blocks,
                          num_host_blocks=args.host_kv_blocks, prefix_cache=not args.no_prefix_cache,
                          kv_dtype=args.kv_cache_dtype),
        scheduler=SchedulerConfig(policy=args.policy, token_budget=budget, max_chunk_tokens=chunk,
                                  max_running=args.max_num_seqs, chunking=args.chunking,
                                  step_time_target_s=args.step_time_target_ms / 1e3,
                                  min_chunk_tokens=args.min_chunk_tokens,
                                  time_slice_s=args.time_slice_s or None,
                                  preemption=PreemptionConfig(recompute_below_tokens=args.recompute_below_tokens,
                                                              swap_above_tokens=args.swap_above_tokens)),
    )


def runtime_config(args: argparse.Namespace) -> RuntimeConfig:
    """A worker process's engine and torch threads, from the engine flags."""
    from pdserve.worker.runtime import RuntimeConfig  # torch: only for a worker

    return RuntimeConfig(engine_config(args), threads=args.threads)


CLI_MAX_TOKENS = 128  # `pdserve generate` asks for fewer tokens than the API's default, and greedy
CLI_TEMPERATURE = 0.0


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """Defaults from SamplingParams, but for max tokens and temperature (the CLI's own, above)."""
    d = SamplingParams()
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=CLI_MAX_TOKENS)
    g.add_argument("--temperature", type=float, default=CLI_TEMPERATURE)
    g.add_argument("--top-p", type=float, default=d.top_p)
    g.add_argument("--top-k", type=int, default=d.top_k)
    g.add_argument("--min-p", type=float, default=d.min_p)
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--stop", action="append", default=[])
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--priority", default="normal", choices=["vip", "normal", "batch"])
    s = g.add_mutually_exclusive_group()  # structured output (pdserve/grammar): one constraint
    s.add_argument("--json-schema", default=None, metavar="SCHEMA", help="a JSON schema, or @FILE holding one")
    s.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    s.add_argument("--regex", default=None, help="the whole output matches this regular expression")
    s.add_argument("--grammar", default=None, metavar="GRAMMAR", help="a Lark or GBNF grammar, or @FILE holding one")
    s.add_argument("--choice", action="append", default=None, help="the output is one of these (repeat the flag)")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, min_p=args.min_p, seed=args.seed, stop=tuple(args.stop),
                          ignore_eos=args.ignore_eos, constraint=constraint(args))


def constraint(args: argparse.Namespace) -> Constraint | None:
    """The structured-output flags' constraint (None: none set)."""
    if args.json_schema is not None:
        return Constraint(ConstraintKind.JSON_SCHEMA, _text_or_file(args.json_schema))
    if args.json_object:
        return Constraint(ConstraintKind.JSON_OBJECT)
    if args.regex is not None:
        return Constraint(ConstraintKind.REGEX, args.regex)
    if args.grammar is not None:
        return Constraint(ConstraintKind.GRAMMAR, _text_or_file(args.grammar))
    if args.choice:
        return Constraint(ConstraintKind.CHOICE, choices=tuple(args.choice))
    return None


def _text_or_file(value: str) -> str:
    return Path(value[1:]).read_text() if value.startswith("@") else value


def priority(args: argparse.Namespace) -> Priority:
    return Priority[args.priority.upper()]
