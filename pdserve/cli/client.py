"""`pdserve generate --target`: one streamed completion from a running router, through
pdserve.client, with what the client saw of its timing."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

from pdserve.cli.options import sampling_params
from pdserve.client import Client, ClientOptions, Completion, Message, PdserveError
from pdserve.client.results import Collector
from pdserve.stats import distribution


def stream_remote(args: argparse.Namespace) -> int:
    options = ClientOptions(token=os.environ.get("PDSERVE_API_TOKEN") or None, tls_ca=args.tls_ca)
    prompt = {"prompt": args.prompt} if args.raw else {"messages": [Message("user", args.prompt)]}
    params = sampling_params(args)  # (its fields as they are: asdict would turn the constraint into a dict)
    sampling = {f.name: getattr(params, f.name) for f in dataclasses.fields(params) if getattr(params, f.name) is not None}
    with Client(args.target, options) as client:
        collector = Collector(time.perf_counter())
        try:
            for chunk in client.stream(**prompt, priority=args.priority, **sampling):
                collector.add(chunk, time.perf_counter())
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
        except PdserveError as exc:
            print(f"\nerror: {exc}", file=sys.stderr)
            return 1
    sys.stdout.write("\n")
    print(f"[{summary(collector.completion)}]", file=sys.stderr)
    return 0


def summary(answer: Completion) -> str:
    gaps = answer.timings.gaps_s
    tbt = distribution(gaps)
    p50, worst = (tbt.p50 * 1e3, tbt.max * 1e3) if tbt else (0.0, 0.0)
    u = answer.usage
    usage = f" prompt={u.prompt_tokens} cached={u.cached_tokens} preemptions={u.preemptions}" if u else ""
    return (f"finish={answer.finish_reason} tokens={len(answer.token_ids)} TTFT={(answer.timings.ttft_s or 0) * 1e3:.1f}"
            f" ms TBT p50={p50:.1f} ms max={worst:.1f} ms{usage}")
