"""`pdserve simulate`: the seed's experiment and capacity planning on the real scheduler policies.

    pdserve simulate --workload seed                       colocated policies + xPyD splits
    pdserve simulate --plan --gpus 8 --slo-ttft 2 --slo-tbt 0.05
    pdserve simulate --validate                            real engine vs simulator, this CPU
"""

from __future__ import annotations

import argparse
import json
import sys

from pdserve.config import CacheConfig, SchedulerConfig

POLICIES = ("fcfs", "decode-first", "chunked")
MAX_MODEL_LEN = {"smollm2-135m": 8192}


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="discrete-event simulation of the scheduler at datacenter scale")
    p.add_argument("--workload", default="seed", help="seed | seed-burst | chat | mixed | shared-prefix | validate")
    p.add_argument("--hardware", default="h100-sxm", choices=["h100-sxm", "h200", "a100-80gb", "cpu-local"])
    p.add_argument("--model", default="llama-3.1-70b", choices=["llama-3.1-70b", "llama-3.1-8b", "smollm2-135m"])
    p.add_argument("--gpus", type=int, default=8, help="GPUs of the colocated configurations and the plan")
    p.add_argument("--tp", type=int, default=None, help="colocated TP (default: all GPUs in one group if it fits)")
    p.add_argument("--policy", action="append", choices=[*POLICIES, "all"], help="colocated policies (default all)")
    p.add_argument("--split", action="append", help="xPyD split, repeatable, 'none' for no split "
                   "(default with 8 GPUs: 4P4D 2P6D 6P2D)")
    p.add_argument("--elastic", action="store_true",
                   help="each split elastic too: the router's planner changes its instances' roles, keeping "
                        "decode steps within --slo-tbt")
    p.add_argument("--ttft-objective", default="",
                   help="the router's admission in each split: seconds to first token per class, as "
                        "vip=2,normal=10 (a request no path serves within it: prefilled by its decode instance, "
                        "deferred if BATCH, else refused); default: none")
    p.add_argument("--tbt-objective", default="", help="admission: seconds between tokens per class, as vip=0.05")
    p.add_argument("--defer-max-s", type=float, default=60.0, help="admission: longest a BATCH request is deferred")
    p.add_argument("--reserve-at", choices=["arrival", "prefill"], default="arrival",
                   help="when a split reserves a prompt's decode blocks: arrival (as the service does, before "
                        "its prefill is queued) or prefill (a what-if: when a prefill instance starts it)")
    p.add_argument("--prefill-tp", type=int, default=None)
    p.add_argument("--decode-tp", type=int, default=None)
    p.add_argument("--token-budget", type=int, default=SchedulerConfig().token_budget)
    p.add_argument("--max-chunk-tokens", type=int, default=SchedulerConfig().max_chunk_tokens)
    p.add_argument("--memory-fraction", type=float, default=0.9)
    p.add_argument("--prefix-cache", choices=["on", "off"], default="on" if CacheConfig().prefix_cache else "off",
                   help="radix prefix cache, or none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, default=None, help="chat arrival rate override (requests/s)")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="seconds, for goodput")
    p.add_argument("--slo-tbt", type=float, default=0.05, help="seconds (a request's p99 TBT), for goodput")
    p.add_argument("--plan", action="store_true", help="rank every xPyD split of --gpus by goodput")
    p.add_argument("--validate", action="store_true", help="calibrate cpu-local and compare with the real engine")
    p.add_argument("--threads", type=int, default=1, help="torch threads for --validate")
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                   help="--validate timing: cpu = the stepping thread's CPU time, idle waits skipped "
                   "(steady on a shared machine; use 1 thread); wall = perf_counter and sleeps")
    p.add_argument("--json", default=None, metavar="FILE", help="write everything as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.validate:
        return _validate(args)
    from pdserve.sim.workloads import get_workload

    try:
        workload = get_workload(args.workload, args.seed, args.rate)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    try:
        cfg = _config(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _plan(args, cfg, workload) if args.plan else _table(args, cfg, workload)


def _config(args: argparse.Namespace):
    from pdserve.sim import get_hardware, get_shape
    from pdserve.sim.deployment import SimConfig

    return SimConfig(get_hardware(args.hardware), get_shape(args.model), token_budget=args.token_budget,
                     max_chunk_tokens=min(args.max_chunk_tokens, args.token_budget),
                     memory_fraction=args.memory_fraction, prefix_cache=args.prefix_cache == "on",
                     tbt_objective_s=args.slo_tbt, admission=_admission(args), reserve_at=args.reserve_at,
                     max_model_len=MAX_MODEL_LEN.get(args.model, SimConfig.max_model_len))


def _admission(args: argparse.Namespace):
    from pdserve.admission import AdmissionPolicy, parse_objectives

    if not (args.ttft_objective or args.tbt_objective):
        return None
    return AdmissionPolicy(parse_objectives(args.ttft_objective, args.tbt_objective), args.defer_max_s)


def _deployments(args: argparse.Namespace, cfg) -> list:
    from pdserve.sim.deployment import Colocated, default_tp, parse_split

    policies = POLICIES if not args.policy or "all" in args.policy else tuple(dict.fromkeys(args.policy))
    tp = args.tp or default_tp(args.gpus, cfg)
    found: list = [Colocated(args.gpus, tp, policy) for policy in policies]
    splits = args.split or (["4P4D", "2P6D", "6P2D"] if args.gpus == 8 else [f"{args.gpus // 2}P{args.gpus - args.gpus // 2}D"])
    policy = "chunked" if "chunked" in policies else policies[0]
    splits = [s for s in splits if s.lower() != "none"]
    found += [parse_split(s, cfg, args.prefill_tp, args.decode_tp, policy) for s in splits]
    if args.elastic:
        found += [parse_split(s, cfg, args.prefill_tp, args.decode_tp, policy, elastic=True) for s in splits]
    return found


def _header(cfg, workload, gpus: int) -> list[str]:
    return [f"workload {workload.name}: {workload.description}",
            f"{cfg.shape.name} on {cfg.hardware.name}, {gpus} GPUs per configuration; token budget {cfg.token_budget}, "
            f"chunk {cfg.max_chunk_tokens}, memory fraction {cfg.memory_fraction}, "
            f"prefix cache {'on' if cfg.prefix_cache else 'off'}; splits reserve decode blocks at {cfg.reserve_at}"
            + (" start (a what-if)" if cfg.reserve_at == "prefill" else "")]


def _table(args: argparse.Namespace, cfg, workload) -> int:
    from pdserve.sim import report
    from pdserve.sim.deployment import InfeasibleDeployment
    from pdserve.sim.metrics import Slo, summarize
    from pdserve.sim.simulator import simulate

    try:
        deployments = _deployments(args, cfg)
    except (InfeasibleDeployment, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    slo = Slo(args.slo_ttft, args.slo_tbt)
    rows, changes, judged = [], [], []
    for deployment in deployments:
        print(f"simulating {deployment.name} ...", file=sys.stderr, flush=True)
        result = simulate(workload, deployment, cfg, trace_steps=True)
        rows.append(report.row(result, summarize(result, slo)))
        changes += [f"{deployment.name}: {c}" for c in result.role_changes]
        if result.admissions:
            judged.append(f"{deployment.name}: " + ", ".join(f"{k} {n}" for k, n in result.admissions))
    bounds = report.physical_bounds(workload, cfg, args.gpus)
    long_kind = "document" if "document" in workload.kinds() else workload.kinds()[-1]
    short_kind = "chat" if "chat" in workload.kinds() else workload.kinds()[0]
    lines = [*_header(cfg, workload, args.gpus), "", report.run_table(rows, short_kind, long_kind), ""]
    if workload.name.startswith("seed"):
        lines += [report.seed_table(), ""]
    lines.append(report.bounds_text(bounds, cfg))
    if changes:
        lines += ["", "role changes (the router's planner):", *changes]
    if judged:
        lines += ["", "admission (the router's policy, verdict/reason):", *judged]
    print("\n".join(lines))
    _write_json(args, {"workload": workload, "config": cfg, "slo": slo, "bounds": bounds, "runs": rows,
                       "seed_figures": report.SEED_FIGURES})
    return 0


def _plan(args: argparse.Namespace, cfg, workload) -> int:
    from pdserve.sim import report
    from pdserve.sim.metrics import Slo
    from pdserve.sim.planner import plan

    slo = Slo(args.slo_ttft, args.slo_tbt)
    policy = (args.policy or ["chunked"])[0]
    policy = "chunked" if policy == "all" else policy
    rows = plan(workload, cfg, args.gpus, slo, policy,
                progress=lambda d: print(f"simulating {d.name} ...", file=sys.stderr, flush=True))
    print("\n".join([*_header(cfg, workload, args.gpus),
                     f"SLO: TTFT <= {slo.ttft_s:g} s and each request's p99 TBT <= {slo.tbt_s * 1e3:g} ms; best first", "",
                     report.plan_table(rows) if rows else "no deployment of these GPUs can hold the model"]))
    _write_json(args, {"workload": workload, "config": cfg, "slo": slo, "plan": rows})
    return 0


def _validate(args: argparse.Namespace) -> int:
    from pdserve.sim.validate import validate

    if args.clock == "cpu" and args.threads != 1:
        print("note: the cpu clock counts one thread; with more torch threads use --clock wall", file=sys.stderr)
    outcome = validate(threads=args.threads, clock=args.clock, seed=args.seed,
                       log=lambda m: print(m, file=sys.stderr, flush=True))
    print(outcome.text())
    _write_json(args, {"validation": outcome})
    return 0 if outcome.within(0.25) else 1


def _write_json(args: argparse.Namespace, payload: dict) -> None:
    if args.json:
        from pdserve.sim.report import jsonable

        with open(args.json, "w") as f:
            json.dump(jsonable(payload), f, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)
