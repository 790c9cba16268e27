"""Admission by predicted time to first token, on real processes: how close the prediction is, and
what an objective does under overload. One run, one pair of workers, two routers over them.

    1 prefill + 1 decode worker (--threads 1 each); router A without objectives, router B with
    --ttft-objective normal=<objective>. The prefill worker's speed is measured first (one long
    prompt alone), then the same open-loop load goes to A, then to B: Poisson arrivals for
    --seconds at --overload times what the prefill worker computes, a mix of chats (short prompts)
    and documents (long ones), few output tokens each (the prompts are the load).

Printed: per router, requests served and refused, TTFT p50/p90/p99 of those served, the share
served within the objective (and that per second: goodput), and measured over predicted TTFT per
request, from the routers' root spans (an OTLP receiver in this process): its percentiles, the
share within 0.8-1.25 and 0.5-2, and the predicted parts (reserve, queue, prefill, transfer)
against the measured TTFT for chats and documents.

    .venv/bin/python benchmarks/ttft_admission.py [--seconds 40] [--overload 1.5] [--objective 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import os
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdserve.cli.supervisor import Supervisor  # noqa: E402
from pdserve.client import AsyncClient, ClientOptions, PdserveError  # noqa: E402
from pdserve.procs.health import wait_serving  # noqa: E402
from pdserve.stats import percentile  # noqa: E402
from tests.helpers.cluster import cluster_flags  # noqa: E402
from tests.helpers.otlp_receivers import GrpcReceiver  # noqa: E402

ENGINE = ["--threads", "1", "--kv-blocks", "1024", "--host-kv-blocks", "64"]
CHAT_TOKENS, DOCUMENT_TOKENS, DOCUMENT_SHARE, OUTPUT_TOKENS = (40, 120), (600, 1200), 0.25, 8


@dataclass(frozen=True)
class Outcome:
    prompt_tokens: int
    ttft_s: float | None  # None: refused
    retry_after_s: float | None = None


def start(sup: Supervisor, objective_s: float, traces: str) -> tuple[str, str]:
    secured = cluster_flags(sup.workdir)
    workers = [sup.spawn(role, [role, "--port", "0", *ENGINE, *secured]) for role in ("prefill", "decode")]
    p, d = (sup.wait_ready(w, 600) for w in workers)
    common = ["--port", "0", "--otlp-traces-endpoint", traces, "--prefill-workers", f"127.0.0.1:{p}",
              "--decode-workers", f"127.0.0.1:{d}", *secured]
    plain = sup.spawn("router-a", ["router", *common])
    strict = sup.spawn("router-b", ["router", *common, "--ttft-objective", f"normal={objective_s}"])
    targets = [f"127.0.0.1:{sup.wait_ready(r, 600)}" for r in (plain, strict)]
    for target in targets:
        wait_serving(target, 120)
    return targets[0], targets[1]


def prompt(tokens: int, rng: random.Random) -> list[int]:
    return [rng.randrange(1000, 40000) for _ in range(tokens)]


async def one(client: AsyncClient, ids: list[int]) -> Outcome:
    try:
        completion = await client.generate(token_ids=ids, max_tokens=OUTPUT_TOKENS, temperature=0, ignore_eos=True)
    except PdserveError as exc:
        if exc.code != "RESOURCE_EXHAUSTED":
            raise
        return Outcome(len(ids), None, exc.retry_after_s)
    return Outcome(len(ids), completion.timings.ttft_s)


async def measure_prefill(target: str) -> float:
    """Prompt tokens per second of one long prompt alone (its TTFT is mostly its prefill)."""
    async with AsyncClient(target, ClientOptions(timeout_s=600)) as client:
        rng = random.Random(7)
        await one(client, prompt(64, rng))  # warm
        ids = prompt(DOCUMENT_TOKENS[1], rng)
        outcome = await one(client, ids)
    assert outcome.ttft_s is not None
    return len(ids) / outcome.ttft_s


async def load(target: str, seconds: float, rate_per_s: float, seed: int, salt: int) -> list[Outcome]:
    """The same arrivals and prompt lengths for every `salt`; the prompts' tokens differ with it, so
    no run finds another's prompts in the prefix cache."""
    rng, words = random.Random(seed), random.Random(seed * 1000 + salt)
    async with AsyncClient(target, ClientOptions(timeout_s=600)) as client:
        tasks, now = [], 0.0
        started = time.monotonic()
        while True:
            now += rng.expovariate(rate_per_s)
            if now > seconds:
                break
            span = DOCUMENT_TOKENS if rng.random() < DOCUMENT_SHARE else CHAT_TOKENS
            ids = prompt(rng.randint(*span), words)
            await asyncio.sleep(max(0.0, started + now - time.monotonic()))
            tasks.append(asyncio.ensure_future(one(client, ids)))
        return list(await asyncio.gather(*tasks))


@dataclass(frozen=True)
class Predicted:
    prompt_tokens: int
    measured_s: float
    predicted_s: float
    parts: tuple[float, float, float, float]  # reserve, queue, prefill, transfer


def predictions(receiver: GrpcReceiver, request_count: int, timeout_s: float = 30.0) -> list[Predicted]:
    """Every root span with a first token and a prediction (the exporter sends them in batches)."""
    def found() -> list:
        return [s.attributes for s in receiver.sink.spans if s.name == "pdserve.generate"
                and "gen_ai.latency.time_to_first_token" in s.attributes and "pdserve.ttft.predicted_s" in s.attributes]

    deadline = time.monotonic() + timeout_s
    while len(found()) < request_count and time.monotonic() < deadline:
        time.sleep(0.2)
    part = "pdserve.ttft.predicted.{}_s".format
    return [Predicted(a["gen_ai.usage.prompt_tokens"], a["gen_ai.latency.time_to_first_token"],
                      a["pdserve.ttft.predicted_s"], tuple(a[part(k)] for k in ("reserve", "queue", "prefill", "transfer")))
            for a in found()]


def report_predictions(found: list[Predicted]) -> None:
    ratios = [p.measured_s / p.predicted_s for p in found if p.predicted_s > 0]
    if not ratios:
        return
    near = sum(0.8 <= r <= 1.25 for r in ratios) / len(ratios)
    close = sum(0.5 <= r <= 2.0 for r in ratios) / len(ratios)
    print(f"  measured/predicted TTFT over {len(ratios)} requests: p10 {percentile(ratios, 10):.2f}, "
          f"p50 {percentile(ratios, 50):.2f}, p90 {percentile(ratios, 90):.2f}; within 0.8-1.25: {near:.0%}, "
          f"within 0.5-2: {close:.0%}")
    for kind, picked in (("chats", [p for p in found if p.prompt_tokens < DOCUMENT_TOKENS[0]]),
                         ("documents", [p for p in found if p.prompt_tokens >= DOCUMENT_TOKENS[0]])):
        if picked:
            mean = [sum(p.parts[i] for p in picked) / len(picked) for i in range(4)]
            measured = sum(p.measured_s for p in picked) / len(picked)
            print(f"  {kind} ({len(picked)}): mean predicted reserve {mean[0]:.3f} + queue {mean[1]:.2f} + prefill "
                  f"{mean[2]:.2f} + transfer {mean[3]:.3f} = {sum(mean):.2f} s; mean measured {measured:.2f} s")


def report(name: str, outcomes: list[Outcome], seconds: float, objective_s: float) -> None:
    served = [o.ttft_s for o in outcomes if o.ttft_s is not None]
    refused = [o for o in outcomes if o.ttft_s is None]
    within = sum(t <= objective_s for t in served)
    print(f"\n{name}: {len(outcomes)} requests, {len(served)} served, {len(refused)} refused")
    if served:
        print(f"  TTFT of those served: p50 {percentile(served, 50):.2f} s, p90 {percentile(served, 90):.2f} s, "
              f"p99 {percentile(served, 99):.2f} s, max {max(served):.2f} s")
    print(f"  within the {objective_s} s objective: {within} ({within / max(1, len(outcomes)):.0%} of all), "
          f"goodput {within / seconds:.2f} requests/s")
    if refused:
        hints = [o.retry_after_s for o in refused if o.retry_after_s is not None]
        print(f"  retry hints: p50 {percentile(hints, 50):.1f} s, max {max(hints):.1f} s" if hints else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--overload", type=float, default=1.5, help="offered prompt tokens over the measured prefill speed")
    ap.add_argument("--objective", type=float, default=3.0, help="router B's NORMAL TTFT objective, seconds")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    receiver = GrpcReceiver()
    sup = Supervisor(env={**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "200"})
    try:
        plain, strict = start(sup, args.objective, receiver.endpoint)
        speed = asyncio.run(measure_prefill(plain))
        mean_prompt = DOCUMENT_SHARE * sum(DOCUMENT_TOKENS) / 2 + (1 - DOCUMENT_SHARE) * sum(CHAT_TOKENS) / 2
        rate = args.overload * speed / mean_prompt
        print(f"prefill speed {speed:.0f} tokens/s (one {DOCUMENT_TOKENS[1]}-token prompt alone); offered "
              f"{rate:.2f} requests/s of {mean_prompt:.0f} prompt tokens on average ({args.overload}x), "
              f"{args.seconds:.0f} s each")
        for salt, (name, target) in enumerate((("A, no objective", plain),
                                               (f"B, --ttft-objective normal={args.objective}", strict))):
            receiver.sink.clear()
            outcomes = asyncio.run(load(target, args.seconds, rate, args.seed, salt))
            report(name, outcomes, args.seconds, args.objective)
            report_predictions(predictions(receiver, sum(o.ttft_s is not None for o in outcomes)))
    finally:
        sup.stop()
        receiver.stop()


if __name__ == "__main__":
    main()
