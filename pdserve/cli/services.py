"""`pdserve router|prefill|decode`: run one service in this process until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal

from pdserve.cli.options import add_engine_flags


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help=f"run the {name} service")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default={"router": 50051, "prefill": 50061, "decode": 50071}[name])
    p.add_argument("--metrics-port", type=int, default=None)
    p.add_argument("--otlp-traces-endpoint", default=None)
    p.add_argument("--ready-file", default=None, help="write the bound port here once serving")
    if name == "router":
        p.add_argument("--model", default=None, help="the workers' model (tokenizer and limits)")
        p.add_argument("--prefill-workers", default="", help="host:port,... of prefill workers")
        p.add_argument("--decode-workers", default="", help="host:port,... of decode workers")
        p.add_argument("--colocated", action="store_true", help="decode workers prefill themselves")
        p.add_argument("--decode-failover", default="resume", choices=["resume", "fail"])
        p.add_argument("--kv-timeout", type=float, default=30.0)
        p.add_argument("--max-active", type=int, default=1024)
        p.add_argument("--kv-capacity-tokens", type=int, default=None)
    else:
        add_engine_flags(p)
        p.add_argument("--transport", default="ucx", choices=["ucx", "none"])
        p.add_argument("--advertise-host", default=None)
    p.set_defaults(run=run, role=name)


def run(args: argparse.Namespace) -> int:
    import uvloop

    return uvloop.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    if args.role == "router":
        from router.main import start_router as start
    elif args.role == "prefill":
        from prefill_service.main import start_prefill as start
    else:
        from decode_service.main import start_decode as start
    service = await start(args)
    if args.ready_file:
        _write_ready(args.ready_file, service.port, service.metrics_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    metrics = f", metrics on :{service.metrics_port}/metrics" if service.metrics_port else ""
    print(f"pdserve {args.role} serving on {args.host}:{service.port}{metrics}", flush=True)
    await stop.wait()
    await service.stop()
    return 0


def _write_ready(path: str, port: int, metrics_port: int | None) -> None:
    """Atomically: the supervisor polls this file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"port": port, "metrics_port": metrics_port}, f)
    os.replace(tmp, path)
