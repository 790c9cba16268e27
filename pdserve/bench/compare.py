"""`pdserve bench --compare`: the seed's experiment, each configuration started here and stopped after.

    service (in this order)            runs (same seed everywhere)
    disaggregated, no prefix cache     shared-prefix
    disaggregated 1P+1D                each document of mixed alone, shared-prefix with the
                                       prefix cache, chat (the chats of mixed, alone)
    disaggregated 1P+1D (fresh)        mixed
    colocated fcfs                     mixed
    colocated decode-first             mixed
    colocated chunked                  mixed

Runs compared by a ratio follow each other in time, so a load that drifts on a shared machine
skews them least. Every service is a fresh process tree (so no run finds another's prompts
cached), warmed up with two tiny requests, and stopped in `finally` whatever happens.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pdserve.bench import runner, workloads
from pdserve.bench.compare_report import CompareRuns, compare_json, compare_rows, format_compare, ratios
from pdserve.bench.report import write_json
from pdserve.procs.up_process import UpProcess
from pdserve.stats import Slo


@dataclass(frozen=True)
class ServiceConfig:
    name: str
    mode: str  # colocated | disaggregated
    policy: str  # the workers' scheduling policy
    prefix_cache: bool = True


@dataclass(frozen=True)
class CompareOptions:
    requests: int | None
    rate: float | None
    seed: int
    shared_requests: int | None
    duration_limit_s: float
    slo: Slo
    kv_blocks: int
    token_budget: int
    max_chunk_tokens: int
    ready_timeout_s: float
    out_dir: Path
    progress: bool


MIXED_CONFIGS = (
    ServiceConfig("colocated-fcfs", "colocated", "fcfs"),
    ServiceConfig("colocated-decode-first", "colocated", "decode-first"),
    ServiceConfig("colocated-chunked", "colocated", "chunked"),
    ServiceConfig("disaggregated", "disaggregated", "chunked"),
)
DISAGGREGATED = MIXED_CONFIGS[-1]
NO_PREFIX_CACHE = ServiceConfig("disaggregated-no-prefix-cache", "disaggregated", "chunked", prefix_cache=False)


def up_argv(config: ServiceConfig, opts: CompareOptions) -> list[str]:
    """`pdserve up` arguments for one configuration: 1 decode worker (+1 prefill when disaggregated)."""
    argv = ["up", "--port", "0", "--http-port", "-1", "--mode", config.mode, "--policy", config.policy,
            "--prefill-workers", "1",
            "--decode-workers", "1", "--kv-blocks", str(opts.kv_blocks), "--token-budget", str(opts.token_budget),
            "--max-chunk-tokens", str(opts.max_chunk_tokens), "--ready-timeout", str(opts.ready_timeout_s),
            "--anonymous-max-priority", "vip"]  # the benchmark measures every class
    return argv + ([] if config.prefix_cache else ["--no-prefix-cache"])


@contextmanager
def service(config: ServiceConfig, opts: CompareOptions) -> Iterator[str]:
    """Starts the configuration as `pdserve up` (a child process), yields its router's address, stops it all."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "UCX_WARN_UNUSED_ENV_VARS": "n"}
    print(f"== starting {config.name}", file=sys.stderr, flush=True)
    with UpProcess(up_argv(config, opts)[1:], env, opts.ready_timeout_s) as up:
        runner.warm_up(up.router)
        yield up.router


def _run(target: str, workload: workloads.Workload, opts: CompareOptions, label: str) -> runner.RunResult:
    return runner.run(target, workload, runner.RunOptions(opts.duration_limit_s, opts.progress, label))


def run_experiment(opts: CompareOptions) -> CompareRuns:
    mixed = workloads.build("mixed", opts.requests, opts.rate, opts.seed)
    chats = workloads.chat(len(mixed.of_kind(workloads.Kind.CHAT)), mixed.rate, opts.seed)
    shared = workloads.build("shared-prefix", opts.shared_requests, None, opts.seed)
    with service(NO_PREFIX_CACHE, opts) as target:
        uncached = _run(target, shared, opts, "shared-prefix, no prefix cache")
    with service(DISAGGREGATED, opts) as target:
        alone = tuple(_run(target, mixed.alone(doc), opts, f"document {doc.index} alone")
                      for doc in mixed.of_kind(workloads.Kind.DOCUMENT))
        cached = _run(target, shared, opts, "shared-prefix, prefix cache")
        chat_run = _run(target, chats, opts, "chat on disaggregated")
    mixed_runs = {}
    for config in (DISAGGREGATED, *(c for c in MIXED_CONFIGS if c is not DISAGGREGATED)):  # right after chat
        with service(config, opts) as target:
            mixed_runs[config.name] = _run(target, mixed, opts, f"mixed on {config.name}")
    mixed_runs = {c.name: mixed_runs[c.name] for c in MIXED_CONFIGS}  # table order
    return CompareRuns(mixed_runs, chat_run, alone, cached, uncached)


def options_from(args: argparse.Namespace) -> CompareOptions:
    return CompareOptions(args.requests, args.rate, args.seed, args.shared_requests, args.duration_limit,
                          Slo(args.slo_ttft, args.slo_tbt), args.kv_blocks, args.token_budget, args.max_chunk_tokens,
                          args.ready_timeout, Path(args.out_dir), not args.no_progress)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def run_compare(args: argparse.Namespace) -> int:
    from pdserve.bench.plot import plot_tbt

    opts = options_from(args)
    signal.signal(signal.SIGTERM, _interrupt)
    runs = run_experiment(opts)
    rows = compare_rows(runs, opts.slo)
    found = ratios(runs, rows, opts.slo)
    print(format_compare(list(rows.values()), found))
    meta = {"argv": sys.argv, **{k: str(v) for k, v in vars(opts).items()}}
    document = compare_json(runs, list(rows.values()), found, opts.slo, meta)
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(opts.out_dir / "compare.json", document)
    plot_tbt(runs, opts.out_dir / "tbt_over_time.png")
    print(f"wrote {opts.out_dir / 'compare.json'} and {opts.out_dir / 'tbt_over_time.png'}")
    return 0
