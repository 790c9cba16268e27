"""`pdserve bench`: load a running router with a workload, or `--compare` the serving configurations."""

from __future__ import annotations

import argparse
import sys

from pdserve.bench.workloads import NAMES
from pdserve.config import CacheConfig


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="gRPC load generator; --compare runs the policy experiment")
    p.add_argument("--target", default=None, help="HOST:PORT of a running router")
    p.add_argument("--workload", default="mixed", choices=(*NAMES, "conversations"),
                   help="conversations: multi-turn chats, reported per turn (--conversations, --turns)")
    p.add_argument("--conversations", type=int, default=16, help="conversations workload: concurrent chats")
    p.add_argument("--turns", type=int, default=6, help="conversations workload: turns of each")
    p.add_argument("--requests", type=int, default=None, help="requests in the workload (default: per workload)")
    p.add_argument("--rate", type=float, default=None, help="mean arrivals per second (default: per workload)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write everything, per-request token times included, here")
    p.add_argument("--slo-ttft", type=float, default=5.0, help="TTFT SLO in seconds (goodput)")
    p.add_argument("--slo-tbt", type=float, default=1.0, help="P99 TBT SLO in seconds (goodput)")
    p.add_argument("--duration-limit", type=float, default=600.0, help="stop a run after this many seconds")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    g = p.add_argument_group("compare")
    g.add_argument("--compare", action="store_true", help="start each configuration and run the experiment")
    g.add_argument("--compare-elastic", action="store_true",
                   help="the shifting workload on three workers: static 1P2D, static 2P1D and `up --elastic`")
    g.add_argument("--out-dir", default="benchmarks/compare_results", help="--compare: JSON and PNG go here")
    g.add_argument("--kv-blocks", type=int, default=CacheConfig().num_blocks,
                   help="--compare: device KV blocks per worker")
    g.add_argument("--token-budget", type=int, default=256, help="--compare: tokens per step")
    g.add_argument("--max-chunk-tokens", type=int, default=128, help="--compare: prefill chunk (chunked policy)")
    g.add_argument("--shared-requests", type=int, default=None, help="--compare: shared-prefix requests")
    g.add_argument("--ready-timeout", type=float, default=300.0, help="--compare: seconds to wait for a service")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.compare:
        from pdserve.bench.compare import run_compare

        return run_compare(args)
    if args.compare_elastic:
        from pdserve.bench.elastic_compare import run_compare_elastic

        return run_compare_elastic(args)
    if not args.target:
        print("error: --target HOST:PORT is required (or --compare)", file=sys.stderr)
        return 2
    if args.workload == "conversations":
        return _run_conversations(args)
    return _run_one(args)


def _run_conversations(args: argparse.Namespace) -> int:
    import asyncio
    import json
    from dataclasses import asdict

    from pdserve.bench.conversations import ConversationSpec, run_conversations, turn_table

    spec = ConversationSpec(args.conversations, args.turns, seed=args.seed)
    records = asyncio.run(run_conversations(args.target, spec))
    print(f"{spec.conversations} conversations x {spec.turns} turns (+{spec.conversations} suffix requests)")
    print(turn_table(records))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in records], f)
    return 0


def _run_one(args: argparse.Namespace) -> int:
    from pdserve.bench import runner, workloads
    from pdserve.bench.report import format_table, to_json, write_json
    from pdserve.bench.stats import Slo, summarize_run

    workload = workloads.build(args.workload, args.requests, args.rate, args.seed)
    slo = Slo(args.slo_ttft, args.slo_tbt)
    options = runner.RunOptions(args.duration_limit, not args.no_progress, args.workload)
    result = runner.run(args.target, workload, options)
    print(format_table(result, summarize_run(result.records, result.duration_s, slo), slo))
    if args.json:
        write_json(args.json, to_json(result, slo))
    return 0 if all(r.ok for r in result.records) else 1
