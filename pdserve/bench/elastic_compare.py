"""`pdserve bench --compare-elastic`: the shifting workload (chats, a burst of documents, chats) on
three workers, each split started here and stopped after, in this order:

    static 1P2D, static 2P1D, elastic (`pdserve up --elastic`, from 1P2D: the planner moves workers)

Reported per split: goodput (requests within both SLOs, per second), chat TBT p50/p99, chat and
document TTFT; then the elastic run against the best static split (by goodput): goodput at least
1.3x and chat P99 TBT within 1.2x is what the elastic fleet is for. One run each, back to back.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path

from pdserve.bench import runner, workloads
from pdserve.bench.compare_report import Row, row
from pdserve.bench.report import write_json
from pdserve.procs.up_process import UpProcess
from pdserve.stats import Slo

SPLITS = (("static 1P2D", ["--prefill-workers", "1", "--decode-workers", "2"]),
          ("static 2P1D", ["--prefill-workers", "2", "--decode-workers", "1"]),
          ("elastic from 1P2D", ["--prefill-workers", "1", "--decode-workers", "2", "--elastic"]))
GOODPUT_AT_LEAST, TBT_AT_MOST = 1.3, 1.2


def run_compare_elastic(args: argparse.Namespace) -> int:
    workload = workloads.build("shifting", args.requests, args.rate, args.seed)
    slo = Slo(args.slo_ttft, args.slo_tbt)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "UCX_WARN_UNUSED_ENV_VARS": "n"}
    common = ["--port", "0", "--http-port", "-1", "--kv-blocks", str(args.kv_blocks), "--token-budget",
              str(args.token_budget), "--max-chunk-tokens", str(args.max_chunk_tokens), "--ready-timeout",
              str(args.ready_timeout), "--anonymous-max-priority", "vip"]
    rows: dict[str, Row] = {}
    for name, flags in SPLITS:
        print(f"== starting {name}", file=sys.stderr, flush=True)
        with UpProcess([*common, *flags], env, args.ready_timeout) as up:
            runner.warm_up(up.router)
            result = runner.run(up.router, workload, runner.RunOptions(args.duration_limit, not args.no_progress,
                                                                      f"shifting on {name}"))
        rows[name] = row(name, result, slo)
    print(_table(rows, workload, slo))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "elastic_compare.json", {"argv": sys.argv, "slo": asdict(slo),
                                              "rows": {name: asdict(r) for name, r in rows.items()}})
    print(f"wrote {out / 'elastic_compare.json'}")
    return 0


def _table(rows: dict[str, Row], workload: workloads.Workload, slo: Slo) -> str:
    duration = max(r.arrival_s for r in workload.requests) or 1.0
    lines = [f"shifting: {len(workload.requests)} requests ({len(workload.of_kind(workloads.Kind.DOCUMENT))} documents"
             f" in a burst), SLO TTFT <= {slo.ttft_s} s and P99 TBT <= {slo.tbt_s} s",
             f"{'split':<20} {'goodput':>9} {'/s':>6} {'chat TBT p50 ms':>15} {'p99 ms':>7} {'chat TTFT p50 s':>15} "
             f"{'doc TTFT mean s':>15} {'max s':>6} {'failed':>6}"]
    for name, r in rows.items():
        lines.append(f"{name:<20} {r.goodput:4d}/{r.requests:<4d} {r.goodput / duration:6.2f} "
                     f"{_f(r.chat_tbt_p50_ms, 1):>15} {_f(r.chat_tbt_p99_ms, 1):>7} {_f(r.chat_ttft_p50_s, 2):>15} "
                     f"{_f(r.doc_ttft_mean_s, 2):>15} {_f(r.doc_ttft_max_s, 2):>6} {r.failed:6d}")
    elastic = rows[SPLITS[-1][0]]
    best = max((rows[n] for n, _ in SPLITS[:-1]), key=lambda r: (r.goodput, -(r.chat_tbt_p99_ms or 0.0)))
    goodput = elastic.goodput / best.goodput if best.goodput else None
    tbt = (elastic.chat_tbt_p99_ms / best.chat_tbt_p99_ms
           if elastic.chat_tbt_p99_ms is not None and best.chat_tbt_p99_ms else None)
    lines.append(f"elastic / best static ({best.label}): goodput {_f(goodput, 2)}x (at least {GOODPUT_AT_LEAST}: "
                 f"{_verdict(goodput, lambda v: v >= GOODPUT_AT_LEAST)}), chat P99 TBT {_f(tbt, 2)}x (at most "
                 f"{TBT_AT_MOST}: {_verdict(tbt, lambda v: v <= TBT_AT_MOST)})")
    return "\n".join(lines)


def _f(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _verdict(value: float | None, ok) -> str:
    return "no figure" if value is None else "meets" if ok(value) else "MISSES"
