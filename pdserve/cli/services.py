"""`pdserve router|prefill|decode`: run one service in this process until SIGINT/SIGTERM.

SIGTERM drains: health turns NOT_SERVING, new work is refused with UNAVAILABLE, work in flight
may finish for --drain-timeout-s, then the process exits 0. A worker whose engine failed turns
NOT_SERVING, lets its failed streams send their statuses, and exits with EXIT_ENGINE_FAILED.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import json
import os
import signal

from pdserve.cli.options import add_engine_flags
from pdserve.config import DeadlineConfig
from pdserve.procs.parent_watch import supervisor_pid, watch_parent
from pdserve.rpc.security import add_security_flags
from router.flow.flow_types import FlowConfig, OnLeave, ReserveAt
from router.fleet.discovery import MAX_REGISTERED_WORKERS
from router.doors.gateway import MAX_ACTIVE
from router.doors.limits import add_limit_flags
from router.placement.admission_flags import add_admission_flags
from router.placement.local_prefill import add_local_prefill_flags
from router.doors.stream_interval import add_stream_interval_flag

DEFAULT_PORTS = {"router": 50051, "prefill": 50061, "decode": 50071}
PLANNER_PERIOD_S = 1.0  # --planner-period-s
EXIT_ENGINE_FAILED = 70  # a supervisor restarts the process


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    deadlines = DeadlineConfig()
    p = sub.add_parser(name, help=f"run the {name} service")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all interfaces)")
    p.add_argument("--port", type=int, default=DEFAULT_PORTS[name])
    p.add_argument("--health-port", type=int, default=None, help="extra plaintext port serving only grpc.health.v1")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics here (0: any free port)")
    p.add_argument("--served-model-name", default=None,
                   help="the name clients call the model by: the metrics' model_name label"
                        + (" and the HTTP API's model (/v1/models, the `model` field)" if name == "router" else "")
                        + " (default: its folder or file name)")
    add_switch(p, "--vllm-metric-names", "export the families vLLM's dashboards read under vLLM's names too "
               "(vllm:time_to_first_token_seconds, vllm:num_requests_waiting, ...), beside pdserve's")
    p.add_argument("--otlp-traces-endpoint", default=None, help="OTLP endpoint for traces (else OTEL_* env)")
    p.add_argument("--drain-timeout-s", type=float,
                   default=float(os.environ.get("PDSERVE_DRAIN_TIMEOUT_S", deadlines.drain_timeout_s)))
    p.add_argument("--ready-file", default=None, help="write the bound ports here (JSON) once serving")
    add_security_flags(p, api_token=name == "router")
    if name == "router":
        _router_flags(p)
    else:
        add_engine_flags(p)
        p.add_argument("--transport", default="ucx", choices=["ucx", "none"])
        add_switch(p, "--elastic", f"serve both roles' services over one model and KV pool, as {name} to begin with; "
                   "WorkerControl.SetRole (`pdserve set-role`) changes the role once its work is done")
        p.add_argument("--advertise-host", default=None, help="host other services dial (default: --host)")
        p.add_argument("--register-with", default="",
                       help="router internal host:port,... (its --internal-port) to register with (heartbeat)")
        p.add_argument("--quarantine-timeout-s", type=float, default=deadlines.quarantine_timeout_s,
                       help="decode: longest that KV blocks a withdrawn receive may write stay out of use")
        p.add_argument("--reattach-grace-s", type=float, default=deadlines.reattach_grace_s,
                       help="decode: how long a request whose router's stream broke (no Abort) decodes on for "
                            "another router to re-attach; then it is aborted and its blocks freed (0: at once)")
        p.add_argument("--kv-checksums", default="on", choices=["on", "off"],
                       help="sum every KV piece sent (xxh3-64) and check it where it lands before it is used "
                            "(one rank, KV in host memory); off: neither")
    p.set_defaults(run=run, role=name)


def add_switch(p: argparse.ArgumentParser, flag: str, help: str) -> None:
    """A flag that is off unless given: `--flag` or `--flag=on` (manifests write every flag with a
    value), `--flag=off`."""
    p.add_argument(flag, nargs="?", const=True, default=False, type=_switch, metavar="on|off", help=help)


def _switch(text: str) -> bool:
    value = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False,
             "0": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"on or off, got {text!r}")
    return value


def _router_flags(p: argparse.ArgumentParser) -> None:
    flow = FlowConfig()
    p.add_argument("--model", default=None, help="the workers' model (tokenizer and limits)")
    p.add_argument("--prefill-workers", default="", help="host:port,... of prefill workers")
    p.add_argument("--decode-workers", default="", help="host:port,... of decode workers")
    p.add_argument("--prefill-dns", default=None, help="NAME:PORT; every address NAME resolves to is a prefill worker")
    p.add_argument("--decode-dns", default=None, help="NAME:PORT; every address NAME resolves to is a decode worker")
    p.add_argument("--dns-refresh-s", type=float, default=5.0)
    p.add_argument("--internal-port", type=int, default=None,
                   help="serve pdserve.v1.Registry (workers' --register-with) and health here, never on --port; "
                        "guarded by the cluster token (0: any free port; default: no registry)")
    p.add_argument("--max-registered-workers", type=int, default=MAX_REGISTERED_WORKERS,
                   help="registered workers at most; a new address beyond it is refused with RESOURCE_EXHAUSTED")
    p.add_argument("--colocated", action="store_true", help="decode workers prefill themselves")
    p.add_argument("--decode-failover", default="resume", choices=["resume", "fail"])
    p.add_argument("--on-leave", default=flow.on_leave.value, choices=[o.value for o in OnLeave],
                   help="a request decoding on a worker that drains or changes role, when another decode worker "
                        "could take it: move its KV there (move), prefill it again there (prefill), or let it "
                        "finish where it is (finish)")
    p.add_argument("--reserve-at", default=flow.reserve_at.value, choices=[r.value for r in ReserveAt],
                   help="when a remote prefill's decode blocks are reserved: once a prefill worker has started the "
                        "prompt, its KV held there until then (prefill), or when the request is placed (arrival)")
    p.add_argument("--canary-interval-s", type=float, default=60.0,
                   help="a fixed greedy prompt through every prefill-decode pair at start and this often; a pair "
                        "answering other than the others leaves rotation (0: no canaries)")
    p.add_argument("--rebalance-interval-s", type=float, default=flow.rebalance_interval_s,
                   help="a request decoding on a worker where requests wait for blocks moves, KV and all, to one "
                        "with room: at most one per worker this often (0: never; only with --on-leave move)")
    p.add_argument("--kv-timeout", type=float, default=flow.kv_timeout_s, help="seconds for a request's KV to arrive")
    p.add_argument("--wait-for-worker-s", type=float, default=flow.wait_for_worker_s,
                   help="how long a request with nothing out yet waits, from its arrival and within its deadline, "
                        "for a usable worker before UNAVAILABLE")
    p.add_argument("--resume-wait-s", type=float, default=flow.resume_wait_s,
                   help="how long a request whose tokens are out (resuming after a fault) waits for a usable "
                        "worker before UNAVAILABLE")
    p.add_argument("--max-active", type=int, default=MAX_ACTIVE, help="requests in flight before RESOURCE_EXHAUSTED")
    p.add_argument("--event-feeds", default="on", choices=["on", "off"],
                   help="each decode worker sends this router's requests' events on one stream, a message per "
                        "engine step (DecodeWorker.Events); off: each request's on its own Decode call")
    add_stream_interval_flag(p)
    p.add_argument("--kv-capacity-tokens", type=int, default=None)
    p.add_argument("--http-port", type=int, default=None,
                   help="serve the OpenAI-compatible HTTP API here (0: any free port; default: gRPC only)")
    add_limit_flags(p)
    add_local_prefill_flags(p)
    add_admission_flags(p)
    add_switch(p, "--planner", "change elastic workers' roles by the fleet's signals (prefill backlog, decode queue, "
               "KV occupancy, step time), with hysteresis; every change logged, counted and traced")
    p.add_argument("--planner-period-s", type=float, default=PLANNER_PERIOD_S, help="seconds between observations")


def run(args: argparse.Namespace) -> int:
    import uvloop

    return uvloop.run(_serve(args))


async def _start(args: argparse.Namespace):
    if args.role == "router":
        from router.main import start_router

        return await start_router(args)
    from pdserve.cli.options import runtime_config

    if getattr(args, "elastic", False):
        from pdserve.cli.elastic import start_elastic

        return await start_elastic(args, runtime_config(args), args.role)
    if args.role == "prefill":
        from prefill_service.main import start_prefill as start
    else:
        from decode_service.main import start_decode as start
    return await start(args, runtime_config(args))


class Stop(enum.Enum):
    """Why a service process stops, and so how."""

    INTERRUPT = "interrupt"  # SIGINT: stop now
    DRAIN = "drain"  # SIGTERM: refuse new work, let work in flight finish, then stop
    ENGINE_FAILED = "engine failed"  # leave rotation, let failed streams flush, exit non-zero


async def _serve(args: argparse.Namespace) -> int:
    service = await _start(args)
    internal_port = getattr(service, "internal_port", None)
    http_port = getattr(service, "http_port", None)
    if args.ready_file:
        _write_ready(args.ready_file, {"port": service.port, "metrics_port": service.metrics_port,
                                       "internal_port": internal_port, "http_port": http_port})
    stops = _stop_queue(service, args.role)
    supervisor = _watch_supervisor(stops)
    metrics = f", metrics on :{service.metrics_port}/metrics" if service.metrics_port else ""
    registry = f", registry on :{internal_port}" if internal_port else ""
    http = f", HTTP (OpenAI API) on :{http_port}" if http_port else ""
    print(f"pdserve {args.role} serving on {args.host}:{service.port}{http}{metrics}{registry}", flush=True)
    stop = await stops.get()
    if supervisor is not None:
        supervisor.cancel()
    if stop is Stop.DRAIN:
        left = await service.drain(args.drain_timeout_s)
        print(f"pdserve {args.role} drained ({left} requests left)", flush=True)
    elif stop is Stop.ENGINE_FAILED:
        print(f"pdserve {args.role}: the engine failed; leaving rotation and exiting", flush=True)
        await service.give_up()
        await service.stop(grace_s=0)
        return EXIT_ENGINE_FAILED
    await service.stop()
    return 0


def _stop_queue(service, role: str) -> asyncio.Queue[Stop]:
    """Signals, and a worker's engine failure, as Stop reasons in arrival order. (By the role, not
    the service's type: the router process never imports the worker's modules, nor torch.)"""
    stops: asyncio.Queue[Stop] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stops.put_nowait, Stop.INTERRUPT)
    loop.add_signal_handler(signal.SIGTERM, stops.put_nowait, Stop.DRAIN)
    if role != "router":
        service.on_engine_failure(lambda _: stops.put_nowait(Stop.ENGINE_FAILED))
    return stops


def _watch_supervisor(stops: asyncio.Queue[Stop]) -> asyncio.Task | None:
    """Under a supervisor (pdserve up, a test fleet, the chaos harness): stop now once it is gone."""
    parent = supervisor_pid(os.environ)
    if parent is None:
        return None

    def orphaned() -> None:
        print("pdserve: the supervisor that started this process is gone; stopping", flush=True)
        stops.put_nowait(Stop.INTERRUPT)

    return asyncio.ensure_future(watch_parent(parent, orphaned))


def _write_ready(path: str, ports: dict[str, int | None]) -> None:
    """Atomically: the supervisor polls this file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(ports, f)
    os.replace(tmp, path)
