"""A step sized by time: a VIP chat's first token while a long document prefills, with chunks sized
by tokens (the CPU defaults: a 512-token budget, 256-token chunks) and by time (--chunking time).

One engine per way over one loaded model (the embedded SmolLM2, `--threads` torch threads), on its
own thread as a worker runs it (AsyncEngine). A trial, as `make run`'s demo has it: two normal
chats decoding; the demo's document (about 1,900 tokens, repeated `--document-times`, batch
priority) arrives; `--vip-after` seconds later (one of several, the same for both ways) a VIP chat
arrives. Per trial: the VIP's time to first token (its arrival to its first token), the document's,
the longest gap between two tokens of the decoding chats while the document prefilled, and the
steps' times. The ways alternate trial by trial; medians are reported.

For each timed way it also prints the start probe's coefficients and the cost model's error:
each step's predicted time (as the model stood when the step was scheduled) against its own.

    .venv/bin/python benchmarks/step_time.py [--trials 6] [--threads 1] [--target-ms 100,200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from pdserve.cli.demo import CHATS, DOCUMENT  # noqa: E402
from pdserve.cli.options import CPU_TOKEN_BUDGET  # noqa: E402
from pdserve.config import CacheConfig, EngineConfig, SchedulerConfig  # noqa: E402
from pdserve.engine.async_engine import AsyncEngine  # noqa: E402
from pdserve.engine.engine import Engine  # noqa: E402
from pdserve.engine.outputs import StepResult  # noqa: E402
from pdserve.requests import Priority, SamplingParams  # noqa: E402
from pdserve.tokenizer import load_tokenizer  # noqa: E402

VIP_AFTER_S = (0.15, 0.4, 0.65, 0.9, 1.15, 1.4)


@dataclass
class Watch:
    """Token times per request and the steps' seconds, as the step listener sees them."""

    tokens: dict[str, list[float]] = field(default_factory=dict)
    steps: list[tuple[float, float, int]] = field(default_factory=list)  # (end, seconds, prompt tokens)
    arrived: dict[str, asyncio.Event] = field(default_factory=dict)

    def on_step(self, result: StepResult) -> None:
        now = time.perf_counter()
        self.steps.append((now, result.seconds, sum(c.num_tokens for c in result.chunks if c.num_tokens > 1)))
        for out in result.outputs:
            if out.new_token_ids:
                self.tokens.setdefault(out.request.request_id, []).append(now)
                event = self.arrived.get(out.request.request_id)
                if event is not None:
                    event.set()

    def first(self, rid: str) -> asyncio.Event:
        """Set once `rid` has a token (already, or when it comes)."""
        event = self.arrived.setdefault(rid, asyncio.Event())
        if rid in self.tokens:
            event.set()
        return event


@dataclass(frozen=True)
class Trial:
    vip_ttft_s: float
    document_ttft_s: float
    chat_gap_max_s: float
    step_max_s: float
    step_p50_s: float


async def trial(engine: AsyncEngine, watch: Watch, n: int, prompts: dict[str, list[int]], vip_after_s: float) -> Trial:
    chats = [f"chat{n}-{i}" for i in range(2)]
    endless = SamplingParams(temperature=0.0, max_tokens=2000, ignore_eos=True)
    for rid in chats:
        await engine.call(lambda e, rid=rid: e.add_request(rid, prompts["chat"], endless, Priority.NORMAL))
    await asyncio.gather(*(watch.first(rid).wait() for rid in chats))
    document, vip = f"document{n}", f"vip{n}"
    started = time.perf_counter()
    first_step = len(watch.steps)
    await engine.call(lambda e: e.add_request(document, [n] + prompts["document"], SamplingParams(max_tokens=1),
                                              Priority.BATCH))
    await asyncio.sleep(vip_after_s)
    vip_at = time.perf_counter()
    await engine.call(lambda e: e.add_request(vip, [n] + prompts["vip"], SamplingParams(max_tokens=4), Priority.VIP))
    await asyncio.gather(watch.first(document).wait(), watch.first(vip).wait())
    done = watch.tokens[document][0]
    for rid in chats:
        await engine.call(lambda e, rid=rid: e.abort(rid))
    gaps = [b - a for rid in chats for a, b in zip(watch.tokens[rid], watch.tokens[rid][1:]) if started <= b <= done]
    steps = [s for end, s, _ in watch.steps[first_step:] if end <= done]
    return Trial(watch.tokens[vip][0] - vip_at, done - started, max(gaps, default=0.0), max(steps),
                 statistics.median(steps))


def engines(args: argparse.Namespace) -> dict[str, Engine]:
    """Chunks by tokens, and by time at each target, over one loaded model."""
    scheduler = SchedulerConfig(token_budget=CPU_TOKEN_BUDGET, max_chunk_tokens=CPU_TOKEN_BUDGET // 2)
    config = EngineConfig(calibrate=True, cache=CacheConfig(num_blocks=1024, num_host_blocks=0), scheduler=scheduler)
    ways = {"tokens": Engine(config)}
    for target_ms in (float(t) for t in args.target_ms.split(",")):
        timed = replace(scheduler, chunking="time", step_time_target_s=target_ms / 1e3)
        ways[f"time {target_ms:g} ms"] = Engine(replace(config, scheduler=timed), loaded=ways["tokens"].loaded)
    return ways


def record_predictions(engine: Engine) -> list[tuple[float, float]]:
    """(predicted, observed) seconds of every step of `engine` from now on."""
    pairs: list[tuple[float, float]] = []
    learn = engine.scheduler.observe

    def observe(output, seconds):
        predicted = engine.scheduler.predicted_step_s(output)
        if predicted is not None and output.chunks:
            pairs.append((predicted, seconds))
        learn(output, seconds)

    engine.scheduler.observe = observe
    return pairs


async def run(args: argparse.Namespace) -> dict[str, list[Trial]]:
    tokenizer = load_tokenizer(None)
    prompts = {"chat": tokenizer.encode(CHATS[1][1]), "vip": tokenizer.encode(CHATS[0][1]),
               "document": tokenizer.encode(DOCUMENT) * args.document_times}
    print(f"document {len(prompts['document']) + 1} tokens, chats {len(prompts['chat'])}, "
          f"VIP {len(prompts['vip']) + 1}")
    built = engines(args)
    predictions = {name: record_predictions(engine) for name, engine in built.items()}
    ways = {name: (AsyncEngine(engine), Watch()) for name, engine in built.items()}
    for engine, watch in ways.values():
        engine.add_listener(watch.on_step)
        engine.start(asyncio.get_running_loop())
    results: dict[str, list[Trial]] = {name: [] for name in ways}
    try:
        for n in range(args.trials):
            for name, (engine, watch) in ways.items():
                results[name].append(await trial(engine, watch, n, prompts, VIP_AFTER_S[n % len(VIP_AFTER_S)]))
    finally:
        for engine, _ in ways.values():
            engine.stop()
    for name, engine in built.items():
        errors = [observed / predicted for predicted, observed in predictions[name]]
        if errors:
            cost = engine.measured.step_cost
            print(f"{name}: probe {cost.fixed_s * 1e3:.1f} ms a step + {cost.decode_row_s * 1e3:.2f} ms a decode row + "
                  f"{cost.prefill_token_s * 1e3:.2f} ms a prompt token + {cost.context_pair_s * 1e9:.1f} us per 1000 "
                  f"pairs; observed / predicted over {len(errors)} steps: median {statistics.median(errors):.2f}, "
                  f"p10 {statistics.quantiles(errors, n=10)[0]:.2f}, p90 {statistics.quantiles(errors, n=10)[-1]:.2f}")
    return results


def report(results: dict[str, list[Trial]]) -> None:
    print(f"{'chunks by':14} {'VIP TTFT':>9} {'doc TTFT':>9} {'chat gap max':>13} {'step max':>9} {'step p50':>9}"
          "   (medians over trials, ms; per trial VIP TTFT)")
    for name, trials in results.items():
        def median(attr: str) -> float:
            return statistics.median(getattr(t, attr) for t in trials) * 1e3

        each = ", ".join(f"{t.vip_ttft_s * 1e3:.0f}" for t in trials)
        print(f"{name:14} {median('vip_ttft_s'):9.0f} {median('document_ttft_s'):9.0f} "
              f"{median('chat_gap_max_s'):13.0f} "
              f"{median('step_max_s'):9.0f} {median('step_p50_s'):9.0f}   ({each})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=6, help="trials per way (VIP arrival times cycle)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--target-ms", default="100,200", help="--step-time-target-ms of each timed way, comma-separated")
    p.add_argument("--document-times", type=int, default=1, help="the demo's document repeated this often")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; threads {args.threads}")
    report(asyncio.run(run(args)))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
