"""`pdserve generate`: stream one completion, in-process (--model) or from a server (--target)."""

from __future__ import annotations

import argparse
import sys
import time

from pdserve.cli.options import add_engine_flags, add_sampling_flags, engine_config, priority, sampling_params


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="stream one completion and print TTFT/TBT")
    p.add_argument("prompt")
    p.add_argument("--target", default=None, help="HOST:PORT of a running router; omit to run in-process")
    p.add_argument("--raw", action="store_true", help="send the prompt as plain text, not as a chat message")
    p.add_argument("--tls-ca", default=None, help="with --target: PEM CA of the router's certificate (TLS); "
                                                  "a tenant's token comes from $PDSERVE_API_TOKEN")
    add_engine_flags(p)
    add_sampling_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.target:
        from pdserve.cli.client import stream_remote

        return stream_remote(args)
    return _stream_local(args)


def _stream_local(args: argparse.Namespace) -> int:
    import torch

    from pdserve.engine.llm import LLM
    from pdserve.tokenizer import ChatMessage

    if args.threads:
        torch.set_num_threads(args.threads)
    llm = LLM(engine_config(args))
    prompt = args.prompt if args.raw else [ChatMessage("user", args.prompt)]
    times = TokenClock()
    for piece in llm.stream(prompt, sampling_params(args), priority(args)):
        times.tick()
        sys.stdout.write(piece.text)
        sys.stdout.flush()
        reason = piece.finish_reason
    sys.stdout.write("\n")
    times.report(reason.value if reason else "?")
    return 0


class TokenClock:
    """Wall-clock TTFT and time between streamed messages, printed to stderr."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.stamps: list[float] = []

    def tick(self) -> None:
        self.stamps.append(time.perf_counter())

    def report(self, finish: str) -> None:
        if not self.stamps:
            print(f"[no tokens; finish={finish}]", file=sys.stderr)
            return
        ttft = self.stamps[0] - self.start
        gaps = sorted(b - a for a, b in zip(self.stamps, self.stamps[1:]))
        p50 = gaps[len(gaps) // 2] if gaps else 0.0
        worst = gaps[-1] if gaps else 0.0
        print(f"[finish={finish} tokens={len(self.stamps)} TTFT={ttft * 1e3:.1f} ms "
              f"TBT p50={p50 * 1e3:.1f} ms max={worst * 1e3:.1f} ms]", file=sys.stderr)
