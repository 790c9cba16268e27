"""`pdserve up`: routers + prefill and decode workers as processes on loopback, supervised.
`--routers N` starts N routers in front of the same workers, each on ports of its own (the
given ports, then the next ones; 0: any free port), each complete on its own (docs/ARCHITECTURE.md,
"A tier of routers").

A child that exits is restarted with backoff on the same port (pdserve/cli/fleet.py); the
service stays up meanwhile. SIGTERM or Ctrl-C drains the routers, then the workers, then exits 0.

The internal plane is closed: every child gets `--cluster-token-file`, a random token written
0600 into the supervisor's workdir (or the file given with --cluster-token-file). The router
serves its Registry on an internal port of its own, so workers started by hand with that token
and `--register-with` (every router's internal address) can join.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path

from pdserve.cli.fleet import Fleet
from pdserve.cli.options import add_engine_flags
from pdserve.cli.services import DEFAULT_PORTS
from pdserve.config import DeadlineConfig
from pdserve.procs.health import wait_serving
from pdserve.procs.supervisor import Child, Supervisor
from pdserve.rpc.security import write_cluster_token
from router.flow.flow_types import FlowConfig
from router.placement.admission_flags import add_admission_flags, admission_argv
from router.placement.local_prefill import add_local_prefill_flags, local_prefill_argv
from router.doors.stream_interval import add_stream_interval_flag, stream_interval_argv

TICK_S = 0.2

ENGINE_FLAGS = ("model", "kv_blocks", "host_kv_blocks", "block_size", "kv_cache_dtype", "token_budget",
                "max_chunk_tokens", "max_num_seqs",
                "policy", "max_model_len", "device", "dtype", "attention_backend", "weight_layout",
                "layer_kernels", "recompute_below_tokens", "swap_above_tokens", "tensor_parallel_size",
                "chunking", "step_time_target_ms", "min_chunk_tokens", "time_slice_s")


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    add_arguments(sub.add_parser(name, help="start the whole service on this machine"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of `pdserve up` (`pdserve serve` takes them too)."""
    deadlines = DeadlineConfig()
    p.add_argument("--port", type=int, default=DEFAULT_PORTS["router"],
                   help="the router's gRPC API (router i of --routers: this + i)")
    p.add_argument("--http-port", type=int, default=8000,
                   help="the router's OpenAI-compatible HTTP API (0: any free port; -1: none; router i: this + i)")
    p.add_argument("--routers", type=_at_least_one, default=1,
                   help="routers in front of the same workers, each with its own ports (a client may use any)")
    p.add_argument("--wait-for-worker-s", type=float, default=FlowConfig().wait_for_worker_s,
                   help="router: how long a request with nothing out yet waits for a usable worker before "
                        "UNAVAILABLE (with a retry hint)")
    p.add_argument("--served-model-name", default=None,
                   help="the model's name in the HTTP API and every child's metrics (model_name)")
    p.add_argument("--vllm-metric-names", action="store_true",
                   help="every child's /metrics under vLLM's names too (vllm:time_to_first_token_seconds, ...)")
    p.add_argument("--prefill-workers", type=int, default=1)
    p.add_argument("--decode-workers", type=int, default=1)
    p.add_argument("--mode", default="disaggregated", choices=["disaggregated", "colocated"])
    p.add_argument("--elastic", action="store_true",
                   help="every worker elastic (its role can change) and the router's planner on: the split "
                        "between prefill and decode follows the load (--prefill-workers, --decode-workers: the start)")
    p.add_argument("--otlp-traces-endpoint", default=None)
    p.add_argument("--demo", action="store_true", help="run a short demo once serving, then keep serving")
    p.add_argument("--kv-timeout", type=float, default=deadlines.kv_timeout_s,
                   help="router: seconds allowed between KV pieces")
    p.add_argument("--decode-failover", default="resume", choices=["resume", "fail"])
    p.add_argument("--on-leave", default="move", choices=["move", "prefill", "finish"],
                   help="router: a request decoding on a worker that leaves (drain, role change) moves its KV to "
                        "another decode worker, is prefilled again there, or finishes where it is")
    p.add_argument("--reserve-at", default="prefill", choices=["prefill", "arrival"],
                   help="router: a remote prefill's decode blocks are reserved once a prefill worker started the "
                        "prompt (its KV held there until then), or when the request is placed")
    p.add_argument("--kv-checksums", default="on", choices=["on", "off"],
                   help="workers: sum every KV piece sent and check it where it lands")
    p.add_argument("--ready-timeout", type=float, default=300.0)
    p.add_argument("--drain-timeout-s", type=float, default=deadlines.drain_timeout_s,
                   help="on SIGTERM: how long the router, then each worker, may finish work in flight")
    p.add_argument("--reattach-grace-s", type=float, default=deadlines.reattach_grace_s,
                   help="decode workers: how long a stream whose router died waits for another router to take it "
                        "on (0: ended at once)")
    p.add_argument("--api-token-file", default=None, help="the router's tenants file (see `pdserve router --help`)")
    p.add_argument("--anonymous-max-priority", default=None, choices=["vip", "normal", "batch"],
                   help="without --api-token-file: the highest class anyone may ask for (default normal; "
                        "with --demo, vip)")
    p.add_argument("--cluster-token-file", type=Path, default=None,
                   help="the token of the internal plane, given to every child (default: a random one written "
                        "0600 into the supervisor's workdir)")
    p.add_argument("--status-file", type=Path, default=None,
                   help="JSON of the router address and every child (name, role, pid, ports, restarts), "
                        "rewritten atomically whenever a child starts or restarts")
    add_engine_flags(p)
    add_local_prefill_flags(p)
    add_admission_flags(p)
    add_stream_interval_flag(p)
    p.set_defaults(run=run)


def worker_argv(args: argparse.Namespace, role: str) -> list[str]:
    argv = [role, "--port", "0", *metrics_argv(args), "--drain-timeout-s", str(args.drain_timeout_s),
            "--cluster-token-file", str(args.cluster_token_file)]
    for flag in ENGINE_FLAGS:
        value = getattr(args, flag)
        if value is not None:
            argv += [f"--{flag.replace('_', '-')}", str(value)]
    if args.no_prefix_cache:
        argv.append("--no-prefix-cache")
    if args.deterministic:
        argv.append("--deterministic")
    if args.otlp_traces_endpoint:
        argv += ["--otlp-traces-endpoint", args.otlp_traces_endpoint]
    if args.elastic:
        argv.append("--elastic")
    argv += ["--kv-checksums", args.kv_checksums, "--reattach-grace-s", str(args.reattach_grace_s)]
    return argv


def metrics_argv(args: argparse.Namespace) -> list[str]:
    """Every child's: /metrics on a free port, labelled with the served name."""
    argv = ["--metrics-port", "0"]
    if args.served_model_name:
        argv += ["--served-model-name", args.served_model_name]
    return argv + (["--vllm-metric-names"] if args.vllm_metric_names else [])


def plan_cpus(count: int) -> list[set[int] | None]:
    """Cores split evenly between workers, each pinned to its share; no pinning when there are
    fewer cores than workers."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < count:
        return [None] * count
    share = len(cores) // count
    return [set(cores[i * share:(i + 1) * share]) for i in range(count)]


def cluster_token(args: argparse.Namespace, sup: Supervisor) -> Path:
    """The children's token file: the one given, else a fresh one in the workdir."""
    if args.cluster_token_file is None:
        args.cluster_token_file = write_cluster_token(sup.workdir / "cluster-token")
    return args.cluster_token_file


def start(args: argparse.Namespace, sup: Supervisor) -> list[int]:
    """Workers, then the routers; every router's gRPC port."""
    cluster_token(args, sup)
    roles = ["decode"] * args.decode_workers
    if args.mode == "disaggregated":
        roles = ["prefill"] * args.prefill_workers + roles
    cpus = plan_cpus(len(roles))
    workers = []
    for i, (role, cpu) in enumerate(zip(roles, cpus)):
        threads = ["--threads", str(len(cpu) if cpu else 1)]
        name = f"{role}-{roles[:i].count(role)}"
        workers.append((role, sup.spawn(name, worker_argv(args, role) + threads, cpu)))
    addresses = {"prefill": [], "decode": []}
    for role, child in workers:
        addresses[role].append(f"127.0.0.1:{sup.wait_ready(child, args.ready_timeout)}")
    routers = [sup.spawn(_router_name(args, i), router_argv(args, addresses, i)) for i in range(args.routers)]
    ports = [sup.wait_ready(router, args.ready_timeout) for router in routers]
    _announce([child for _, child in workers], routers, args.cluster_token_file, sup.workdir)
    return ports


def _announce(workers: list[Child], routers: list[Child], token_file: Path, workdir: Path) -> None:
    """Where every child listens: each router's gRPC and HTTP addresses, and their registries."""
    for child in [*workers, *routers]:
        print(f"{child.name}: grpc 127.0.0.1:{child.port}, metrics http://127.0.0.1:{child.metrics_port}/metrics "
              f"(pid {child.pid})", flush=True)
    for router in routers:
        if router.http_port:
            print(f"{router.name}: HTTP (OpenAI API) http://127.0.0.1:{router.http_port}/v1", flush=True)
    registries = ",".join(f"127.0.0.1:{_internal_port(r)}" for r in routers)
    print(f"registry (workers' --register-with): {registries}; cluster token in {token_file}", flush=True)
    print(f"logs in {workdir}", flush=True)


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1, got {value}")
    return value


def _router_name(args: argparse.Namespace, index: int) -> str:
    return "router" if args.routers == 1 else f"router-{index}"


def _nth_port(port: int, index: int) -> int:
    """Router `index`'s port from the one given (0: any free port; negative: none)."""
    return port if port <= 0 else port + index


def _internal_port(router: Child) -> int | None:
    return json.loads(router.ready_file.read_text()).get("internal_port")


def router_argv(args: argparse.Namespace, addresses: dict[str, list[str]], index: int = 0) -> list[str]:
    argv = ["router", "--port", str(_nth_port(args.port, index)), *metrics_argv(args),
            "--prefill-workers", ",".join(addresses["prefill"]),
            "--decode-workers", ",".join(addresses["decode"]), "--drain-timeout-s", str(args.drain_timeout_s),
            "--cluster-token-file", str(args.cluster_token_file), "--internal-port", "0"]
    if args.model:
        argv += ["--model", args.model]
    if args.mode == "colocated":
        argv.append("--colocated")
    if args.elastic:
        argv.append("--planner")
    argv += ["--kv-timeout", str(args.kv_timeout), "--decode-failover", args.decode_failover,
             "--on-leave", args.on_leave, "--reserve-at", args.reserve_at,
             "--wait-for-worker-s", str(args.wait_for_worker_s)]
    if args.otlp_traces_endpoint:
        argv += ["--otlp-traces-endpoint", args.otlp_traces_endpoint]
    if args.api_token_file:
        argv += ["--api-token-file", args.api_token_file]
    if args.http_port >= 0:
        argv += ["--http-port", str(_nth_port(args.http_port, index))]
    argv += local_prefill_argv(args) + admission_argv(args) + stream_interval_argv(args)
    return argv + ["--anonymous-max-priority", args.anonymous_max_priority or ("vip" if args.demo else "normal")]


def run(args: argparse.Namespace) -> int:
    sup = Supervisor(die_with_parent=True)
    fleet = Fleet(sup, status_file=args.status_file, cluster_token_file=cluster_token(args, sup))
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        ports = start(args, sup)
        fleet.adopt()
        for port in ports:
            wait_serving(f"127.0.0.1:{port}", args.ready_timeout)
        print(f"pdserve is SERVING on {', '.join(f'127.0.0.1:{p}' for p in ports)} (Ctrl-C to stop)", flush=True)
        if args.demo:
            from pdserve.cli.demo import run_demo

            run_demo(f"127.0.0.1:{ports[0]}")
        supervise(fleet, args.drain_timeout_s)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        sup.stop()


def supervise(fleet: Fleet, drain_timeout_s: float) -> None:
    """Restart what exits until SIGTERM or SIGINT, then drain in order."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(TICK_S):
        fleet.tick()
    print("stopping: draining the routers, then the workers", flush=True)
    fleet.drain(drain_timeout_s)
    print("pdserve stopped", flush=True)


def _interrupt(*_) -> None:
    """SIGTERM during start-up: stop like Ctrl-C."""
    raise KeyboardInterrupt

