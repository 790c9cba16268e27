"""The router's relay cost: its CPU per relayed token and the latency it adds, through both doors.

A fake decode worker (pdserve/bench/fake_workers.py: real gRPC, no model) streams ordinary words
of the embedded model's vocabulary, paced per stream, ignore_eos, stepping as an engine does (every
--step-us, 1 ms: each stream's tokens due go together, on the router's event feed one message for
all its streams: `--event-feeds off` the router's, one message per stream); the real router relays them
(`pdserve router --colocated`: the decode worker prefills for itself, so no prefill worker takes
part); clients in a process of their own (pdserve/bench/relay_clients.py) keep N streams of
--tokens tokens in flight through the gRPC door (pdserve.v1.Generation/Generate) or the HTTP door
(/v1/completions, stream=true) and record each token's receipt. For each door, N and offered rate
(tokens/s, all streams together), over the window measured after the warm-up:

    delivered      tokens the clients received in the window, per second
    router CPU     its utime+stime (/proc, every thread) in the window: % of one core, and per
                   token delivered (µs); `*`: saturated (90% of a core or more); ceiling: the
                   tokens/s it would relay at 100% of one core at that cost
    +ms p50/p99    from the fake worker's send to the client's receipt, per token, joined on
                   (request id, index) with the worker's send log (CLOCK_MONOTONIC, one host)
    client, fake   their CPU, % of one core; others: every other process's (all cores' busy time
                   less the three's), % of one core: they all share the machine's nproc cores

    .venv/bin/python benchmarks/relay.py [--quick] [--doors grpc,http] [--streams 64,256]
        [--rates 1000,3000,10000,30000,100000] [--tokens 200] [--warmup 2] [--measure 6]
        [--stream-interval N|Tms] [--step-us N] [--event-feeds on|off] [--insecure] [--pin] [--json PATH]

`--pin` (Linux, 2 CPUs or more): the router alone on the first CPU, this script, the fake worker
and the clients on the others, as a router has its own core in a deployment: its added latency
is then its own, not the benchmark's processes' taking its core (other processes on the machine
still may: see "others").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdserve.bench import fake_workers  # noqa: E402
from pdserve.bench.fake_workers import SendLogReader  # noqa: E402
from pdserve.bench.relay_clients import router_added_ms  # noqa: E402
from pdserve.procs.health import wait_serving  # noqa: E402
from pdserve.procs.supervisor import Child, Supervisor  # noqa: E402
from pdserve.rpc.security import write_cluster_token  # noqa: E402
from pdserve.stats import distribution  # noqa: E402

SATURATED_PCT = 90.0
CLIENT_SLACK_S = 60.0  # a client process's start and end, beyond its warm-up and window


@dataclass(frozen=True)
class Row:
    door: str
    streams: int
    offered: float
    delivered: float
    router_pct: float
    router_us_per_token: float | None
    ceiling: float | None  # tokens/s the router would relay at 100% of one core, at this µs/token
    added_p50_ms: float | None
    added_p99_ms: float | None
    client_pct: float
    fake_pct: float
    others_pct: float  # every other process of the machine (all cores busy, less the three)
    errors: int
    disordered: int
    first_error: str = ""


HEADER = (f"{'door':<5} {'streams':>7} {'offered':>8} {'delivered':>9} {'router':>7} {'µs/tok':>7} {'ceiling':>7} "
          f"{'+ms p50':>8} {'+ms p99':>8} {'client':>7} {'fake':>6} {'others':>7} {'errors':>6}")
UNITS = (f"{'':<5} {'':>7} {'tok/s':>8} {'tok/s':>9} {'CPU %':>7} {'router':>7} {'tok/s':>7} {'':>8} {'':>8} "
         f"{'CPU %':>7} {'CPU %':>6} {'CPU %':>7} {'':>6}")


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def row_line(r: Row) -> str:
    mark = "*" if r.router_pct >= SATURATED_PCT else " "
    return (f"{r.door:<5} {r.streams:>7} {r.offered:>8.0f} {r.delivered:>9.0f} {r.router_pct:>6.0f}{mark} "
            f"{_cell(r.router_us_per_token, '>7.1f')} {_cell(r.ceiling, '>7.0f')} {_cell(r.added_p50_ms, '>8.2f')} "
            f"{_cell(r.added_p99_ms, '>8.2f')} {r.client_pct:>7.0f} {r.fake_pct:>6.0f} {r.others_pct:>7.0f} "
            f"{r.errors + r.disordered:>6}")


def row_of(result: dict, sent: dict[str, list[int]]) -> Row:
    load, cpu = result["load"], result["cpu_s"]
    window_s = (result["window_ns"][1] - result["window_ns"][0]) / 1e9
    tokens = sum(len(s["received"]) for s in result["streams"])
    added = distribution(router_added_ms(result, sent))
    pct = {name: 100 * seconds / window_s for name, seconds in cpu.items()}
    others = pct["machine"] - pct["router"] - pct["client"] - pct["fake"]
    per_token = 1e6 * cpu["router"] / tokens if tokens and cpu["router"] else None
    return Row(load["door"], load["streams"], load["rate"], tokens / window_s, pct["router"], per_token,
               per_token and 1e6 / per_token, added and added.p50, added and added.p99,
               pct["client"], pct["fake"], others, len(result["errors"]), result["disordered"],
               (result["errors"] or [""])[0])


def run_clients(args: argparse.Namespace, door: str, streams: int, rate: float, tag: str, router: Child,
                fake: fake_workers.FakeProcess, workdir: Path) -> dict:
    out = workdir / f"{tag}.json"
    argv = [sys.executable, "-m", "pdserve.bench.relay_clients", "--door", door, "--target",
            f"127.0.0.1:{router.port}", "--http", f"http://127.0.0.1:{router.http_port}", "--streams", str(streams),
            "--rate", str(rate), "--tokens", str(args.tokens), "--warmup", str(args.warmup), "--measure",
            str(args.measure), "--tag", tag, "--pid", f"router={router.pid}", "--pid", f"fake={fake.pid}",
            "--out", str(out)]
    subprocess.run(argv, check=True, timeout=args.warmup + args.measure + CLIENT_SLACK_S)
    return json.loads(out.read_text())


def router_has_flag(flag: str) -> bool:
    shown = subprocess.run([sys.executable, "-m", "pdserve.cli.main", "router", "--help"], capture_output=True,
                           text=True, check=True).stdout
    return flag in shown


def start_router(sup: Supervisor, fake: fake_workers.FakeProcess, args: argparse.Namespace) -> Child:
    secured = ["--insecure"] if args.insecure else \
        ["--cluster-token-file", str(write_cluster_token(sup.workdir / "cluster-token"))]
    interval = ["--stream-interval", str(args.stream_interval)] if args.stream_interval else []
    feeds = ["--event-feeds", args.event_feeds] if args.event_feeds else []
    router = sup.spawn("router", ["router", "--port", "0", "--http-port", "0", "--colocated", "--decode-workers",
                                  fake.address, "--canary-interval-s", "0", *secured, *interval, *feeds])
    wait_serving(f"127.0.0.1:{sup.wait_ready(router, 120)}", 60)
    return router


def pin_threads(pid: int, cpu: int) -> None:
    """Every thread of `pid` on `cpu` (the threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), [cpu])


def run(args: argparse.Namespace) -> list[Row]:
    workdir = Path(tempfile.mkdtemp(prefix="pdserve-relay-"))
    cpus = sorted(os.sched_getaffinity(0))
    pinned = args.pin and len(cpus) > 1
    if pinned:  # this process and all it starts (the router re-pinned below) off the router's CPU
        os.sched_setaffinity(0, cpus[1:])
    fake = fake_workers.start_process(workdir, workdir / "sent.jsonl", step_us=args.step_us)
    sup = Supervisor(env={**os.environ, "HF_HUB_OFFLINE": "1"}, workdir=workdir)
    rows: list[Row] = []
    try:
        router = start_router(sup, fake, args)
        if pinned:
            pin_threads(router.pid, cpus[0])
            print(f"--pin: the router on CPU {cpus[0]}, the fake worker and clients on {cpus[1:]}")
        sent = SendLogReader(workdir / "sent.jsonl")
        print(f"router pid {router.pid}, fake decode worker pid {fake.pid}, {os.cpu_count()} CPUs; logs in {workdir}")
        print(HEADER + "\n" + UNITS, flush=True)
        configs = [(d, n, r) for d in args.doors for n in args.streams for r in args.rates]
        for i, (door, streams, rate) in enumerate(configs):
            result = run_clients(args, door, streams, rate, f"c{i}-", router, fake, workdir)
            fake.wait_idle()
            rows.append(row_of(result, sent.read_new()))
            print(row_line(rows[-1]), flush=True)
            if router.exited():
                raise RuntimeError(f"the router exited; see {sup.log_of(router)}")
    finally:
        sup.stop()
        fake.stop()
    return rows


def _numbers(text: str) -> list[int]:
    return [int(float(v)) for v in text.split(",") if v]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 64 streams at 10K tok/s through each door, short")
    p.add_argument("--doors", default="grpc,http")
    p.add_argument("--streams", default="64,256", help="streams in flight, comma-separated")
    p.add_argument("--rates", default="1000,3000,10000,30000,100000", help="offered tokens/s, comma-separated")
    p.add_argument("--tokens", type=int, default=200, help="per stream")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before the window")
    p.add_argument("--measure", type=float, default=6.0, help="seconds of the window")
    p.add_argument("--stream-interval", default=None,
                   help="the router's --stream-interval: tokens per message (4) or milliseconds (20ms); skipped "
                        "where it has none")
    p.add_argument("--step-us", type=int, default=fake_workers.DEFAULT_STEP_US,
                   help="the fake decode worker's step: every stream's tokens due by then go out together")
    p.add_argument("--event-feeds", default=None, choices=["on", "off"],
                   help="the router's --event-feeds (default: its own default)")
    p.add_argument("--insecure", action="store_true", help="the router without a cluster token")
    p.add_argument("--pin", action="store_true",
                   help="the router alone on one CPU, the fake worker and clients on the others")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args()
    args.doors = args.doors.split(",")
    args.streams, args.rates = _numbers(args.streams), _numbers(args.rates)
    if args.quick:
        args.streams, args.rates, args.warmup, args.measure = [64], [10_000], 1.0, 3.0
    if args.stream_interval and not router_has_flag("--stream-interval"):
        print(f"--stream-interval {args.stream_interval}: not supported (this router has no --stream-interval flag "
              "yet); skipped")
        return
    print(" ".join([os.path.basename(sys.executable), *sys.argv]))
    rows = run(args)
    print("* router saturated (>= 90% of one core); ceiling: tok/s at 100% of one core at this µs/token; +ms: fake "
          "worker's send to client's receipt; others: CPU of every other process; errors: failed or out-of-order "
          "streams")
    for r in rows:
        if r.first_error:
            print(f"{r.door} {r.streams} streams at {r.offered:.0f} tok/s: {r.errors} errors, first: {r.first_error}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
