"""Prefill tokens computed with and without the radix prefix cache, on a shared-prefix workload.

Requests share one of a few system prompts (e.g. 1,000 tokens) and add a unique question; some
are follow-up turns that resend an earlier conversation. The real scheduler runs with a fake
executor that only samples, so the figures count tokens and steps, not seconds.

    .venv/bin/python benchmarks/prefix_cache.py --requests 400 --system 1000 --systems 4 --blocks 4096
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pdserve.config import CacheConfig, SchedulerConfig  # noqa: E402
from pdserve.requests import Request, SamplingParams  # noqa: E402
from pdserve.scheduler import make_scheduler  # noqa: E402


@dataclass(frozen=True)
class Result:
    prompt_tokens: int
    prefill_tokens: int
    steps: int
    mean_ttft_steps: float
    cached_tokens: int


def workload(args: argparse.Namespace) -> list[tuple[int, list[int], int]]:
    """(arrival step, prompt, max_tokens) per request."""
    rng = random.Random(args.seed)
    systems = [[rng.randrange(100, 30_000) for _ in range(args.system)] for _ in range(args.systems)]
    history: list[list[int]] = []
    out = []
    for i in range(args.requests):
        if history and rng.random() < args.followups:
            prompt = rng.choice(history) + [rng.randrange(100, 30_000) for _ in range(rng.randint(10, 60))]
        else:
            question = [rng.randrange(100, 30_000) for _ in range(rng.randint(20, args.question))]
            prompt = rng.choice(systems) + question
        history.append(prompt + [7] * args.output)  # the answer the fake executor gives
        out.append((i // args.per_step, prompt, args.output))
    return out


def run(args: argparse.Namespace, prefix_cache: bool) -> Result:
    cache = CacheConfig(block_size=16, num_blocks=args.blocks, num_host_blocks=0, prefix_cache=prefix_cache)
    sched = SchedulerConfig(token_budget=args.budget, max_chunk_tokens=args.chunk, max_running=args.running)
    step_no = 0
    s = make_scheduler(sched, cache, 46_080, 32_768, lambda: float(step_no))
    pending = workload(args)
    first_token: dict[str, int] = {}
    arrived: dict[str, int] = {}
    requests, prefill = [], 0
    while pending or s.has_work():
        while pending and pending[0][0] <= step_no:
            _, prompt, max_tokens = pending.pop(0)
            r = Request(f"r{len(requests)}", prompt, SamplingParams(max_tokens=max_tokens))
            s.add(r)
            requests.append(r)
            arrived[r.request_id] = step_no
        output = s.schedule()
        prefill += sum(min(c.end, c.request.num_prompt_tokens) - c.start for c in output.chunks
                       if c.start < c.request.num_prompt_tokens)
        sampled = {c.request.request_id: 7 for c in output.chunks if c.samples}
        for rid in sampled:
            first_token.setdefault(rid, step_no)
        s.update(output, sampled)
        step_no += 1
    ttft = [first_token[r.request_id] - arrived[r.request_id] + 1 for r in requests]
    return Result(sum(r.num_prompt_tokens for r in requests), prefill, step_no, sum(ttft) / len(ttft),
                  sum(r.num_cached_tokens for r in requests))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--system", type=int, default=1000, help="system prompt tokens")
    parser.add_argument("--systems", type=int, default=4, help="distinct system prompts")
    parser.add_argument("--question", type=int, default=200, help="max unique tokens per question")
    parser.add_argument("--followups", type=float, default=0.3, help="share of follow-up turns")
    parser.add_argument("--output", type=int, default=32, help="output tokens per request")
    parser.add_argument("--per-step", type=int, default=2, help="arrivals per scheduler step")
    parser.add_argument("--blocks", type=int, default=4096)
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--running", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{args.requests} requests, {args.systems} system prompts of {args.system} tokens, "
          f"{args.followups:.0%} follow-ups, {args.blocks} blocks of 16, budget {args.budget}")
    results = {name: run(args, enabled) for name, enabled in (("no prefix cache", False), ("radix cache", True))}
    for name, r in results.items():
        print(f"{name:>16}: prompt tokens {r.prompt_tokens:>9,}  prefill computed {r.prefill_tokens:>9,}  "
              f"cached {r.cached_tokens:>9,}  steps {r.steps:>6,}  mean TTFT {r.mean_ttft_steps:6.1f} steps")
    off, on = results["no prefix cache"], results["radix cache"]
    print(f"prefill tokens saved: {1 - on.prefill_tokens / off.prefill_tokens:.1%}; "
          f"steps {off.steps} -> {on.steps}")


if __name__ == "__main__":
    main()
