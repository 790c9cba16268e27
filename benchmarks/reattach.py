"""Streams that go on at the other router when theirs dies: two routers in front of one prefill and
two decode workers; 60 greedy streams (half through pdserve.client given both routers, half through
the OpenAI door, which POSTs again with Last-Event-ID), once without a fault, then with router 0
SIGKILLed once every stream has its first token, then with router 1 SIGSTOPped so. Printed:
whether every output equals its no-fault run (no token lost or repeated), the re-attach time (the
fault to the stream's first chunk from the other router), the extra latency (a stream's whole time
over its no-fault run's) and its largest gap, and the memory the orphans of a router nobody
re-attaches hold during the grace (decode blocks; finished results' tokens).

    PYTHONPATH=. .venv/bin/python benchmarks/reattach.py [--streams 60] [--tokens 1200] [--model tiny|embedded]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdserve.cli.supervisor import Supervisor  # noqa: E402
from pdserve.client import Client, ClientOptions  # noqa: E402
from pdserve.procs.health import wait_serving  # noqa: E402
from tests.helpers.cluster import cluster_flags  # noqa: E402
from tests.helpers.metrics import gauge  # noqa: E402
from tests.helpers.sse import stream_completion  # noqa: E402
from tests.helpers.worker_stats import worker_stats  # noqa: E402

GRACE_S = 15.0


@dataclass
class Run:
    """One stream: its door, its routers in order, what it got and when."""

    index: int
    http: bool
    order: tuple[int, int]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    times: list[float] = field(default_factory=list)  # each chunk's (or event's) arrival
    count: int = 0  # tokens it has
    moved_at: float | None = None  # its first chunk from the other router, once it failed over
    started: threading.Event = field(default_factory=threading.Event)

    @property
    def prompt(self) -> str:
        return f"Story {self.index}: once upon a time a scheduler split long prompts into chunks"

    def saw(self, tokens: int, failovers: int = 0) -> None:
        self.times.append(time.monotonic())
        self.count = tokens
        if failovers and self.moved_at is None:
            self.moved_at = self.times[-1]
        if tokens:
            self.started.set()


@dataclass
class Fleet:
    sup: Supervisor
    model_name: str
    decode: list
    routers: list

    def target(self, i: int) -> str:
        return f"127.0.0.1:{self.routers[i].port}"


def _start(model: str | None) -> Fleet:
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    secured = cluster_flags(sup.workdir)
    engine = (["--model", model] if model else []) + ["--threads", "1", "--kv-blocks", "4096", "--host-kv-blocks", "64"]
    prefill = sup.spawn("prefill", ["prefill", "--port", "0", *engine, *secured])
    decode = [sup.spawn(f"decode-{i}", ["decode", "--port", "0", "--metrics-port", "0", *engine,
                                        "--reattach-grace-s", str(GRACE_S), *secured]) for i in range(2)]
    ports = {w.name: sup.wait_ready(w, 600) for w in (prefill, *decode)}
    named = ["--model", model] if model else []
    routers = [sup.spawn(f"router-{i}", ["router", "--port", "0", "--http-port", "0", *named,
                                         "--prefill-workers", f"127.0.0.1:{ports['prefill']}", "--decode-workers",
                                         ",".join(f"127.0.0.1:{ports[d.name]}" for d in decode),
                                         "--canary-interval-s", "0", *secured]) for i in range(2)]
    for router in routers:
        wait_serving(f"127.0.0.1:{sup.wait_ready(router, 600)}", 120)
    with urllib.request.urlopen(f"http://127.0.0.1:{routers[0].http_port}/v1/models", timeout=30) as reply:
        name = json.loads(reply.read())["data"][0]["id"]
    return Fleet(sup, name, decode, routers)


def _stream(fleet: Fleet, run: Run, tokens: int, request_id: str) -> Run:
    if run.http:
        ports = [fleet.routers[i].http_port for i in run.order]
        body = {"model": fleet.model_name, "prompt": run.prompt, "max_tokens": tokens, "temperature": 0,
                "ignore_eos": True}
        run.text = stream_completion(ports, body, request_id, failovers=6,
                                     on_event=lambda s: run.saw(s.tokens, len(s.posts) - 1)).text
        return run
    with Client([fleet.target(i) for i in run.order], ClientOptions(timeout_s=600, failovers=6)) as client:
        stream = client.stream(run.prompt, request_id=request_id, max_tokens=tokens, temperature=0, ignore_eos=True)
        for chunk in stream:
            run.tokens.extend(chunk.token_ids)
            run.text += chunk.text
            run.saw(len(run.tokens), stream.failovers)
    return run


def _round(fleet: Fleet, streams: int, tokens: int, tag: str, act=None) -> tuple[list[Run], float, float]:
    """Every stream at once; `act()` once each has its first token. The runs, when they started, and act's time."""
    runs = [Run(i, i % 2 == 1, (0, 1) if i % 4 < 2 else (1, 0)) for i in range(streams)]
    began = time.monotonic()
    with ThreadPoolExecutor(streams) as pool:
        futures = [pool.submit(_stream, fleet, run, tokens, f"{tag}-{run.index}") for run in runs]
        acted = 0.0
        if act is not None:
            for run in runs:
                run.started.wait(600)
            acted = time.monotonic()
            act()
        for future in futures:
            future.result()
    return runs, began, acted


def _restart(fleet: Fleet, i: int) -> None:
    """The killed router again, on its ports."""
    fleet.routers[i].process.wait(30)
    fleet.sup.respawn(fleet.routers[i])
    fleet.sup.wait_ready(fleet.routers[i], 600)
    wait_serving(fleet.target(i), 120)


def _report(what: str, faulted: list[Run], clean: list[Run], clean_s: dict[int, float], began: float, acted: float,
            router: int) -> None:
    equal = [(r.tokens, r.text) == (c.tokens, c.text) for r, c in zip(faulted, clean)]
    by_door = {http: sum(e for e, r in zip(equal, faulted) if r.http == http) for http in (False, True)}
    print(f"{what}: outputs equal to the no-fault run {sum(equal)}/{len(faulted)} (gRPC {by_door[False]}, "
          f"OpenAI {by_door[True]})")
    cut = [r for r in faulted if r.order[0] == router and r.times[-1] > acted]
    for door, http in (("gRPC", False), ("OpenAI", True)):
        mine = [r for r in cut if r.http == http and r.moved_at is not None]
        if not mine:
            continue
        reattach = sorted(r.moved_at - acted for r in mine)
        extra = sorted((r.times[-1] - began) - clean_s[r.index] for r in mine)
        gaps = sorted(_largest_gap(r) - _largest_gap(clean[r.index]) for r in mine)
        print(f"  {door}: {len(mine)} streams cut; re-attach (the fault to the next chunk) median "
              f"{statistics.median(reattach):.2f} s, max {reattach[-1]:.2f} s; extra latency (whole stream over "
              f"its no-fault run) median {statistics.median(extra):.2f} s, max {extra[-1]:.2f} s; largest gap "
              f"between chunks over the no-fault run's median {statistics.median(gaps):.2f} s, max {gaps[-1]:.2f} s")


def _largest_gap(run: Run) -> float:
    return max((b - a for a, b in zip(run.times, run.times[1:])), default=0.0)


def _memory_during_grace(fleet: Fleet, streams: int, tokens: int) -> None:
    """Streams through router 0 alone (no client re-attaches): what the orphans hold until the grace ends."""
    runs = [Run(i, False, (0, 0)) for i in range(streams)]

    def orphaned(run: Run) -> None:
        try:
            with Client(fleet.target(0), ClientOptions(timeout_s=600, failovers=0)) as client:
                for chunk in client.stream(run.prompt, request_id=f"grace-{run.index}", max_tokens=tokens,
                                           temperature=0, ignore_eos=True):
                    run.saw(len(chunk.token_ids))
        except Exception:  # noqa: BLE001 - its router is killed under it
            pass

    threads = [threading.Thread(target=orphaned, args=(run,), daemon=True) for run in runs]
    for thread in threads:
        thread.start()
    for run in runs:
        run.started.wait(600)
    before = _decode_blocks(fleet)
    killed = time.monotonic()
    fleet.sup.kill(fleet.routers[0])
    peak, orphans, zero_at = before, 0.0, None
    while time.monotonic() - killed < GRACE_S * 2 + 10:
        held, kept = _decode_blocks(fleet), _leases(fleet, "orphan")
        peak, orphans = max(peak, held), max(orphans, kept)
        if held == 0 and kept == 0:
            zero_at = time.monotonic() - killed
            break
        time.sleep(0.2)
    ended = "never" if zero_at is None else f"{zero_at:.1f} s after the kill"
    print(f"grace {GRACE_S:.0f} s, {streams} streams of a router killed and not continued ({tokens} tokens each): "
          f"decode blocks active {before} at the kill, {peak} at most during the grace (orphans decode on), "
          f"{orphans:.0f} orphan leases at most; blocks and orphans back to 0 {ended}; finished results kept "
          f"then: {_leases(fleet, 'result'):.0f} (4 bytes a token, no block)")


def _leases(fleet: Fleet, kind: str) -> float:
    return sum(gauge(d.metrics_port, "pdserve_leases", {"lease": kind}) for d in fleet.decode)


def _decode_blocks(fleet: Fleet) -> int:
    return sum(worker_stats(f"127.0.0.1:{d.port}", "decode").blocks_active for d in fleet.decode)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=60)
    ap.add_argument("--tokens", type=int, default=1200)
    ap.add_argument("--model", default="tiny", choices=["tiny", "embedded"])
    args = ap.parse_args()
    model = None
    if args.model == "tiny":
        from tests.helpers.tiny_models import tiny_qwen2_bias

        model = str(tiny_qwen2_bias(Path(tempfile.mkdtemp(prefix="reattach-")) / "qwen2", max_positions=4096))
    fleet = _start(model)
    try:
        clean, began, _ = _round(fleet, args.streams, args.tokens, "clean")
        clean_s = {r.index: r.times[-1] - began for r in clean}
        print(f"{args.model} model, {args.streams} streams ({args.tokens} tokens, greedy; half gRPC, half OpenAI)")
        faulted, began, killed = _round(fleet, args.streams, args.tokens, "fault",
                                        lambda: fleet.sup.kill(fleet.routers[0]))
        _report("router 0 SIGKILLed once each had its first token", faulted, clean, clean_s, began, killed, 0)
        _restart(fleet, 0)
        try:
            stopped, began, stop_at = _round(fleet, args.streams, args.tokens, "stop",
                                             lambda: fleet.sup.kill(fleet.routers[1], signal.SIGSTOP))
        finally:
            fleet.sup.kill(fleet.routers[1], signal.SIGCONT)
        _report("router 1 SIGSTOPped (SIGCONT at the end)", stopped, clean, clean_s, began, stop_at, 1)
        _memory_during_grace(fleet, min(20, args.streams), args.tokens * 3)
    finally:
        fleet.sup.stop()


if __name__ == "__main__":
    main()
