"""The HTTP door against the gRPC door: tokens/s and TTFT on the same load, one service, one run.

One service (1 prefill + 1 decode + router with --http-port) is started; rounds alternate which
door goes first (ABBA), each round sending the same concurrent greedy streams through one door.
The HTTP client reads raw server-sent events (aiohttp), so the figure is the server's door, not
a client library's parsing. Ratios are HTTP over gRPC of the medians over rounds.

    .venv/bin/python benchmarks/http_vs_grpc.py [--rounds 6] [--concurrency 8] [--tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdserve.cli.supervisor import Supervisor  # noqa: E402
from pdserve.procs.health import wait_serving  # noqa: E402
from pdserve.v1 import generation_pb2 as pb  # noqa: E402
from pdserve.v1 import generation_pb2_grpc  # noqa: E402
from tests.helpers.cluster import cluster_flags  # noqa: E402

ENGINE = ["--threads", "1", "--kv-blocks", "512", "--host-kv-blocks", "16"]


@dataclass(frozen=True)
class Round:
    tokens_per_s: float
    ttft_p50_s: float


def start(sup: Supervisor) -> tuple[str, str]:
    secured = cluster_flags(sup.workdir)
    workers = [sup.spawn(role, [role, "--port", "0", *ENGINE, *secured]) for role in ("prefill", "decode")]
    p, d = (sup.wait_ready(w, 600) for w in workers)
    router = sup.spawn("router", ["router", "--port", "0", "--http-port", "0", "--prefill-workers", f"127.0.0.1:{p}",
                                  "--decode-workers", f"127.0.0.1:{d}", *secured])
    target = f"127.0.0.1:{sup.wait_ready(router, 600)}"
    wait_serving(target, 120)
    return target, f"http://127.0.0.1:{router.http_port}"


async def grpc_stream(stub, prompt: str, tokens: int) -> tuple[float, int]:
    started, first, count = time.perf_counter(), None, 0
    request = pb.GenerateRequest(text=prompt, sampling=pb.SamplingParams(max_tokens=tokens, temperature=0,
                                                                         ignore_eos=True))
    async for response in stub.Generate(request, timeout=600):
        if response.token_ids and first is None:
            first = time.perf_counter() - started
        count += len(response.token_ids)
    return first or 0.0, count


async def http_stream(session: aiohttp.ClientSession, url: str, prompt: str, tokens: int) -> tuple[float, int]:
    started, first, count = time.perf_counter(), None, 0
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"] and first is None:
                first = time.perf_counter() - started
            if chunk.get("usage"):
                count = chunk["usage"]["completion_tokens"]
    return first or 0.0, count


async def one_round(door: str, target: str, url: str, prompts: list[str], tokens: int) -> Round:
    started = time.perf_counter()
    if door == "grpc":
        async with grpc.aio.insecure_channel(target) as channel:
            stub = generation_pb2_grpc.GenerationStub(channel)
            results = await asyncio.gather(*(grpc_stream(stub, p, tokens) for p in prompts))
    else:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=len(prompts))) as session:
            results = await asyncio.gather(*(http_stream(session, url, p, tokens) for p in prompts))
    wall = time.perf_counter() - started
    return Round(sum(n for _, n in results) / wall, statistics.median(t for t, _ in results))


async def measure(target: str, url: str, args) -> dict[str, list[Round]]:
    rounds: dict[str, list[Round]] = {"grpc": [], "http": []}
    for i in range(args.rounds):
        prompts = [f"Round {i}, story {j}: once upon a time in a city by the river," for j in range(args.concurrency)]
        order = ("grpc", "http") if i % 4 in (0, 3) else ("http", "grpc")  # ABBA
        for door in order:
            rounds[door].append(await one_round(door, target, url, prompts, args.tokens))
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    sup = Supervisor()
    try:
        target, url = start(sup)
        asyncio.run(one_round("grpc", target, url, ["warm up"] * 2, 8))
        rounds = asyncio.run(measure(target, url, args))
    finally:
        sup.stop()
    med = {door: (statistics.median(r.tokens_per_s for r in rs), statistics.median(r.ttft_p50_s for r in rs))
           for door, rs in rounds.items()}
    print(f"{args.rounds} rounds (ABBA) x {args.concurrency} concurrent greedy streams x {args.tokens} tokens")
    print("| door | tokens/s (median of rounds) | TTFT p50 (median of rounds) |")
    print("|---|---|---|")
    for door in ("grpc", "http"):
        print(f"| {door} | {med[door][0]:.1f} | {med[door][1] * 1000:.0f} ms |")
    print(f"HTTP/gRPC tokens/s ratio: {med['http'][0] / med['grpc'][0]:.3f}; "
          f"TTFT ratio (gRPC/HTTP, higher is better for HTTP): {med['grpc'][1] / med['http'][1]:.3f}")


if __name__ == "__main__":
    main()
