"""The clients of the relay benchmark (benchmarks/relay.py): N streams kept in flight through one
of the router's public doors, each paced by the fake decode worker its request id instructs
(pdserve/bench/fake_workers.py), the receipt time of every token recorded.

    grpc   pdserve.v1.Generation/Generate on raw stubs, a prompt of token ids
    http   POST /v1/completions with stream=true, read as server-sent events (aiohttp); each of
           the fake worker's tokens is a word with its leading space, so a chunk's tokens are its spaces

Run as a process of its own (`python -m pdserve.bench.relay_clients ...`), apart from the router
and the fake worker: after the warm-up it reads its own CPU time, the given processes' and the
machine's (/proc) at both ends of the measured window, then cancels its streams and writes one
JSON document: the window, the CPU seconds, and each stream's receipts within the window (times
on CLOCK_MONOTONIC, which the fake worker's send log shares).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import grpc

from pdserve.bench.fake_workers import WORDS, relay_id, word_ids
from pdserve.v1 import generation_pb2 as gpb
from pdserve.v1 import generation_pb2_grpc

CALL_TIMEOUT_S = 600.0
PROMPT_TOKENS = 8
RETRY_PAUSE_S = 0.1  # after a failed stream, before its slot sends the next


@dataclass
class Stream:
    """One request as its client saw it; kept as it was when the request is cancelled."""

    request_id: str
    received: list[int] = field(default_factory=list)  # CLOCK_MONOTONIC ns of each token's receipt
    token_ids: list[int] = field(default_factory=list)  # gRPC only
    text: list[str] = field(default_factory=list)  # HTTP only: each chunk's text
    finish: str = ""  # "length", "stop" or "abort" once it ended


class Door(ABC):
    """One of the router's public doors."""

    @abstractmethod
    async def stream(self, stream: Stream, prompt: list[int], max_tokens: int) -> None:
        """Sends one greedy ignore_eos request and records its tokens into `stream` as they come."""

    @abstractmethod
    async def close(self) -> None: ...


class GrpcDoor(Door):
    def __init__(self, target: str):
        self._channel = grpc.aio.insecure_channel(target)
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)

    async def stream(self, stream: Stream, prompt: list[int], max_tokens: int) -> None:
        request = gpb.GenerateRequest(request_id=stream.request_id, token_ids=gpb.TokenIds(ids=prompt),
                                      sampling=gpb.SamplingParams(max_tokens=max_tokens, temperature=0,
                                                                  ignore_eos=True))
        async for response in self._stub.Generate(request, timeout=CALL_TIMEOUT_S):
            now = time.monotonic_ns()
            stream.received.extend([now] * len(response.token_ids))
            stream.token_ids.extend(response.token_ids)
            if response.finish_reason:
                stream.finish = gpb.FinishReason.Name(response.finish_reason).removeprefix("FINISH_REASON_").lower()

    async def close(self) -> None:
        await self._channel.close()


class HttpDoor(Door):
    def __init__(self, base_url: str, model: str, session: aiohttp.ClientSession):
        self._url = f"{base_url}/v1/completions"
        self._model = model
        self._session = session

    @classmethod
    async def open(cls, base_url: str) -> HttpDoor:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                        timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S))
        async with session.get(f"{base_url}/v1/models") as response:
            model = (await response.json())["data"][0]["id"]
        return cls(base_url, model, session)

    async def stream(self, stream: Stream, prompt: list[int], max_tokens: int) -> None:
        body = {"model": self._model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "ignore_eos": True, "request_id": stream.request_id}
        async with self._session.post(self._url, json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")
            async for line in response.content:
                if not line.startswith(b"data: ") or (payload := line[6:].strip()) == b"[DONE]":
                    continue
                now = time.monotonic_ns()
                chunk = json.loads(payload)
                if "choices" not in chunk:
                    raise RuntimeError(f"the stream failed: {payload[:200]!r}")
                choice = chunk["choices"][0]
                stream.received.extend([now] * choice["text"].count(" "))
                stream.text.append(choice["text"])
                stream.finish = choice["finish_reason"] or ""

    async def close(self) -> None:
        await self._session.close()


async def open_door(name: str, grpc_target: str, http_url: str) -> Door:
    return GrpcDoor(grpc_target) if name == "grpc" else await HttpDoor.open(http_url)


def in_order(stream: Stream, ids: tuple[int, ...]) -> bool:
    """Whether the stream's tokens so far are the fake worker's words, in order."""
    n = len(stream.received)
    if stream.text:
        words = WORDS.split(" ")[1:]
        return "".join(stream.text) == "".join(f" {words[k % len(words)]}" for k in range(n))
    return stream.token_ids == [ids[k % len(ids)] for k in range(n)]


@dataclass(frozen=True)
class Load:
    door: str  # "grpc" | "http"
    streams: int  # in flight at once: a slot sends its next request as soon as one ends
    rate: float  # tokens/s offered, all streams together
    tokens: int  # per stream
    warmup_s: float
    measure_s: float
    tag: str  # begins every request id of this load (after the pace)

    @property
    def interval_s(self) -> float:
        """Between two tokens of one stream."""
        return self.streams / self.rate


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of every thread of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent running something (user, nice, system, irq, softirq) since boot."""
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in Path("/proc/stat").read_text().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    return {**{name: cpu_seconds(pid) for name, pid in pids.items()}, "machine": machine_busy_seconds()}


async def run_load(door: Door, load: Load, pids: dict[str, int], ids: tuple[int, ...]) -> dict:
    """Keeps `load.streams` in flight (their starts spread over one token interval), measures
    after the warm-up, then cancels them. `pids`: processes whose CPU time is measured, by name
    (this one is "client")."""
    streams: list[Stream] = []
    errors: list[str] = []
    prompt = list(ids[:PROMPT_TOKENS])

    async def slot(j: int) -> None:
        await asyncio.sleep(j / load.rate)
        for seq in itertools.count():
            stream = Stream(relay_id(load.interval_s, f"{load.tag}{j}.{seq}"))
            streams.append(stream)
            try:
                await door.stream(stream, prompt, load.tokens)
            except Exception as exc:  # counted and shown; the slot goes on
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
                await asyncio.sleep(RETRY_PAUSE_S)

    tasks = [asyncio.ensure_future(slot(j)) for j in range(load.streams)]
    pids = {**pids, "client": os.getpid()}
    await asyncio.sleep(load.warmup_s)
    before, t0 = _cpu(pids), time.monotonic_ns()
    await asyncio.sleep(load.measure_s)
    after, t1 = _cpu(pids), time.monotonic_ns()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"load": asdict(load), "window_ns": [t0, t1], "cpu_s": {k: after[k] - before[k] for k in after},
            "errors": errors, "disordered": sum(not in_order(s, ids) for s in streams),
            "finished": sum(s.finish == "length" for s in streams), "streams": [_windowed(s, t0, t1) for s in streams]}


def _windowed(stream: Stream, t0: int, t1: int) -> dict:
    """Its receipts within [t0, t1] and the index of the first of them (they are in order)."""
    inside = [(k, t) for k, t in enumerate(stream.received) if t0 <= t <= t1]
    return {"id": stream.request_id, "first": inside[0][0] if inside else 0, "received": [t for _, t in inside]}


def router_added_ms(result: dict, sent: dict[str, list[int]]) -> list[float]:
    """Milliseconds from the fake worker's send to the client's receipt of every token received
    in the window (`sent`: the send log, pdserve.bench.fake_workers.SendLogReader)."""
    added = []
    for s in result["streams"]:
        times = sent.get(s["id"], [])
        added += [(t - times[k]) / 1e6 for k, t in enumerate(s["received"], s["first"]) if k < len(times)]
    return added


async def _main(args: argparse.Namespace) -> None:
    from pdserve.tokenizer import load_tokenizer

    ids = word_ids(load_tokenizer(None))
    load = Load(args.door, args.streams, args.rate, args.tokens, args.warmup, args.measure, args.tag)
    door = await open_door(args.door, args.target, args.http)
    try:
        pids = {name: int(pid) for name, pid in (value.split("=", 1) for value in args.pid)}
        result = await run_load(door, load, pids, ids)
    finally:
        await door.close()
    Path(args.out).write_text(json.dumps(result))


def main(argv: list[str] | None = None) -> None:
    import uvloop

    p = argparse.ArgumentParser(description="relay benchmark clients (see benchmarks/relay.py)")
    p.add_argument("--door", choices=["grpc", "http"], required=True)
    p.add_argument("--target", required=True, help="the router's gRPC host:port")
    p.add_argument("--http", required=True, help="the router's HTTP base URL")
    p.add_argument("--streams", type=int, required=True)
    p.add_argument("--rate", type=float, required=True, help="tokens/s offered, all streams together")
    p.add_argument("--tokens", type=int, required=True, help="per stream")
    p.add_argument("--warmup", type=float, required=True)
    p.add_argument("--measure", type=float, required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--pid", action="append", default=[], help="NAME=PID whose CPU time to measure (repeat)")
    p.add_argument("--out", required=True)
    uvloop.run(_main(p.parse_args(argv)))


if __name__ == "__main__":
    main()
